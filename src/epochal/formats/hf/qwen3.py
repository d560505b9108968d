"""Hugging Face ``Qwen3ForCausalLM`` <-> epochal ``GPTModel``.

Qwen3 is Llama's layout (:mod:`epochal.formats.hf.llama`) with QK-norm: an RMSNorm
over each head's ``head_dim`` channels on the queries and keys, before the
rotary embedding, one weight ``[head_dim]`` shared by the heads. That is
``qk_layernorm=True``::

    model.layers.L.self_attn.q_norm.weight  <-> layers.L.attention.q_layernorm.weight
    model.layers.L.self_attn.k_norm.weight  <-> layers.L.attention.k_layernorm.weight

``head_dim`` is its own option (Qwen3-8B: 128 with hidden 4096 and 32 heads; when
``config.json`` omits it, transformers' default 128) -> ``kv_channels``.
``attention_bias=True`` puts biases on q, k, v *and* o but not the MLP, which
epochal cannot represent (``add_bias_linear`` covers ``o_proj`` and the MLP
together): it is refused. Sliding windows as in :mod:`epochal.formats.hf.qwen2`;
RoPE as for Llama.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.llama import (
    decoder_config,
    decoder_export_problems,
    decoder_json,
)
from epochal.formats.hf.qwen2 import layer_window, qwen_window_json
from epochal.model.config import ModelConfig

__all__ = [
    "ours_config_from_qwen3",
    "qwen3_config_from_ours",
]

#: transformers' ``Qwen3Config.head_dim`` default (used when config.json has none).
_DEFAULT_HEAD_DIM = 128


def ours_config_from_qwen3(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` from a Qwen3 ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly (named).
    """
    if hf.get("attention_bias", False):
        raise ConversionError(
            "config.json: attention_bias=True is not supported for Qwen3 (biases on q, k, v and "
            "o_proj without MLP biases; epochal's add_bias_linear covers o_proj and the MLP "
            "together)"
        )
    return decoder_config(
        hf,
        family="Qwen3",
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        sliding_window=layer_window(hf),
        default_head_dim=_DEFAULT_HEAD_DIM,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    )


def qwen3_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A Qwen3 ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not a Qwen3 (every difference named).
    """
    problems = decoder_export_problems(config)
    if not config.qk_layernorm:
        problems.append("qk_layernorm=False (Qwen3 normalizes queries and keys)")
    if config.qkv_bias or config.add_bias_linear:
        problems.append(
            f"add_qkv_bias={config.qkv_bias}, add_bias_linear={config.add_bias_linear} "
            "(Qwen3 has no biases)"
        )
    if problems:
        raise ConversionError("cannot export to Qwen3: " + "; ".join(problems))
    return {
        **decoder_json(config, architecture="Qwen3ForCausalLM", model_type="qwen3", dtype=dtype),
        "attention_bias": False,
        **qwen_window_json(config),
    }
