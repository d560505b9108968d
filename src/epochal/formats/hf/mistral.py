"""Hugging Face ``MistralForCausalLM`` <-> epochal ``GPTModel``.

Mistral is Llama's layout without biases (:mod:`epochal.formats.hf.llama`, same
tensor names and rotary layout) plus sliding-window attention in every layer:
``sliding_window`` (Mistral 7B v0.1: 4096; ``null`` in v0.2 and later, i.e. full
causal attention) -> our ``sliding_window``, where each query attends to itself
and the ``sliding_window - 1`` tokens before it, as transformers' mask does.
``head_dim`` (Mistral NeMo: 128 with hidden 5120) -> ``kv_channels``. RoPE as for
Llama. ``MistralForCausalLM`` ignores ``layer_types`` (transformers warns and
uses ``sliding_window`` everywhere), and so does the import.
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
from epochal.model.config import ModelConfig

__all__ = [
    "mistral_config_from_ours",
    "ours_config_from_mistral",
]


def ours_config_from_mistral(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` from a Mistral ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly (named).
    """
    window = hf.get("sliding_window")
    if window is not None and (not isinstance(window, int) or isinstance(window, bool)):
        raise ConversionError(
            f"config.json: sliding_window must be null or an integer >= 1, got {window!r}"
        )
    return decoder_config(
        hf,
        family="Mistral",
        add_bias_linear=False,
        add_qkv_bias=False,
        sliding_window=window,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    )


def mistral_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A Mistral ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not a Mistral (every difference named).
    """
    problems = decoder_export_problems(config)
    if config.qkv_bias or config.add_bias_linear:
        problems.append(
            f"add_qkv_bias={config.qkv_bias}, add_bias_linear={config.add_bias_linear} "
            "(Mistral has no biases)"
        )
    if config.qk_layernorm:
        problems.append("qk_layernorm=True (Mistral has no QK-norm)")
    if problems:
        raise ConversionError("cannot export to Mistral: " + "; ".join(problems))
    return {
        **decoder_json(
            config, architecture="MistralForCausalLM", model_type="mistral", dtype=dtype
        ),
        "sliding_window": config.sliding_window,
    }
