"""Hugging Face ``Qwen2ForCausalLM`` (Qwen2, Qwen2.5) <-> epochal ``GPTModel``.

Qwen2 is Llama's layout (:mod:`epochal.formats.hf.llama`, same tensor names and
rotary layout) with biases on the q/k/v projections only: ``o_proj`` and the MLP
have none. That is ``add_bias_linear=False`` with ``add_qkv_bias=True``. Tied
embeddings (Qwen2.5 0.5B-3B) and untied ones both convert.

Sliding-window attention: Qwen2's ``use_sliding_window`` applies
``sliding_window`` to the layers from ``max_window_layers`` on (or to those
``layer_types`` marks ``"sliding_attention"``). epochal's window is the same in
every layer (``sliding_window``), so a window on every layer imports as it, no
layer with a window imports as full attention, and a mix is refused naming the
keys. Export writes ``use_sliding_window`` with ``max_window_layers=0`` (a window)
or ``max_window_layers=num_hidden_layers`` (none), and the matching ``layer_types``.

RoPE and its scaling are read and written as for Llama (``default``, ``linear``,
``llama3``); others (``yarn``, ``dynamic``, ...) are refused naming the type.
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
    "layer_window",
    "ours_config_from_qwen2",
    "qwen2_config_from_ours",
    "qwen_window_json",
]

_LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_window(hf: Mapping[str, Any]) -> int | None:
    """The one sliding window of a Qwen2 / Qwen3 ``config.json``'s layers, or ``None``.

    Raises:
        ConversionError: some layers have the window and others do not, an unknown
            layer type, or a window that is not a positive integer (keys named).
    """
    if not hf.get("use_sliding_window", False):
        return None  # transformers then sets sliding_window to None: every layer is full
    window = hf.get("sliding_window")
    layers = int(hf["num_hidden_layers"])
    types = hf.get("layer_types")
    if types is None:
        first = int(hf.get("max_window_layers", 28))  # transformers' default
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) != layers or set(types) - set(_LAYER_TYPES):
        raise ConversionError(
            f"config.json: layer_types={types!r} must list {layers} entries, each one of "
            f"{_LAYER_TYPES}"
        )
    if "sliding_attention" not in types:
        return None
    if "full_attention" in types:
        raise ConversionError(
            f"config.json: use_sliding_window=True with layer_types={types!r} "
            f"(max_window_layers={hf.get('max_window_layers')!r}): a window in some layers only "
            "is not supported (epochal's sliding_window applies to every layer)"
        )
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConversionError(
            f"config.json: use_sliding_window=True needs sliding_window to be an integer >= 1, "
            f"got {window!r}"
        )
    return window


def qwen_window_json(config: ModelConfig) -> dict[str, Any]:
    """The sliding-window keys of a Qwen2 / Qwen3 ``config.json`` for ``config``."""
    window = config.sliding_window
    kind = "full_attention" if window is None else "sliding_attention"
    return {
        "use_sliding_window": window is not None,
        "sliding_window": window,
        "max_window_layers": config.num_layers if window is None else 0,
        "layer_types": [kind] * config.num_layers,
    }


def ours_config_from_qwen2(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` from a Qwen2 ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly (named).
    """
    return decoder_config(
        hf,
        family="Qwen2",
        add_bias_linear=False,
        add_qkv_bias=True,
        sliding_window=layer_window(hf),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    )


def qwen2_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A Qwen2 ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not a Qwen2 (every difference named).
    """
    problems = decoder_export_problems(config)
    if not config.qkv_bias or config.add_bias_linear:
        problems.append(
            f"add_qkv_bias={config.qkv_bias}, add_bias_linear={config.add_bias_linear} "
            "(Qwen2 has biases on q, k and v only)"
        )
    if config.qk_layernorm:
        problems.append("qk_layernorm=True (Qwen2 has no QK-norm)")
    if problems:
        raise ConversionError("cannot export to Qwen2: " + "; ".join(problems))
    return {
        **decoder_json(config, architecture="Qwen2ForCausalLM", model_type="qwen2", dtype=dtype),
        **qwen_window_json(config),
    }
