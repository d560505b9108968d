"""Wrappers applied to one model part while the engine builds it: ``torch.compile`` and autocast."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from epochal._eager import disable_compile_everywhere

__all__ = ["autocast_forward", "compile_part"]


def compile_part(part: nn.Module, unit_keys: Sequence[str], *, tensor_parallel: bool) -> None:
    """``torch.compile`` a model part in place: each block, or the whole part under tensor parallelism.

    Without tensor parallelism every block (recompute unit) is compiled on its
    own, as the single-process trainer does. Under tensor parallelism the
    blocks' inputs and outputs cross DTensor boundaries (the plans' hooks), and
    compiling blocks separately is unreliable with torch 2.13 on CPU: with
    sequence parallelism and RoPE the backward fails (a redistribution receives
    a plain tensor), without sequence parallelism inductor recurses without end,
    and embedding gradients have been observed to come out silently zero. The
    whole part is therefore compiled as one graph (DTensor collectives inside),
    which gives the single-process gradients (tested). The functions that must run
    eagerly (:mod:`epochal._eager`) get their disabled versions first.
    """
    disable_compile_everywhere()
    if tensor_parallel:
        part.compile()
        return
    for key in unit_keys:
        part.layers[key].compile()


def autocast_forward(module: nn.Module, dtype: torch.dtype, device_type: str) -> None:
    forward = module.forward

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = wrapped  # instance attribute: parameters and names unchanged
