"""Grouped experts: every routed expert of an MoE layer in one grouped GEMM per projection.

Megatron-Core's ``--moe-grouped-gemm`` (its ``GroupedMLP``; torchtitan's ``grouped_mm``
experts). The layer's assignments (token ``t``, slot ``j``) that are kept are sorted by
expert, stably, so each expert's rows are in the order the per-expert loop gathers them
(token order, then slot); the rows are gathered once, and each projection is one
``torch.nn.functional.grouped_mm`` of ``[n, in]`` rows against the experts' weights stacked
to ``[E, in, out]``, group ``e`` the rows of expert ``e`` (``offs``: the groups' cumulative
ends). The results are weighted and put back in their slots ``[T, k, hidden]``; the layer
adds the slots in their fixed order as with the loop.

Each group's product is the matrix product of that expert's rows alone (the CPU kernel
multiplies group by group), so the forward gives the per-expert loop's bits; the gradient
of the tokens gathers each token's contributions in one scatter (the loop adds one
zero-filled gradient per expert), so gradients agree within float rounding. Where
``grouped_mm`` is missing, or on CUDA for other dtypes than bfloat16 (its kernels' scope),
the same computation runs group by group (:func:`_grouped_matmul`'s loop): that fallback
gives the grouped path's bits.

The experts keep their own parameters (``experts.{e}.w1`` ...: the checkpoint names of
the loop, so runs, conversions and resharding are unchanged); the stacking copies each
projection's weights once per call (``E * in * out`` elements; its backward splits the
gradient back). Linear biases are not supported (as in Megatron-Core's ``GroupedMLP``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from epochal.model.layers.mlp import ACTIVATION_FUNCTIONS, GATED_ACTIVATIONS

__all__ = ["grouped_expert_slots"]

_GROUPED_MM = getattr(F, "grouped_mm", None)


def _grouped_matmul(
    rows: torch.Tensor, weights: torch.Tensor, counts: list[int], offs: torch.Tensor
) -> torch.Tensor:
    """``rows`` ``[n, in]`` grouped by ``counts``, group ``e`` times ``weights[e]`` ``[in, out]``."""
    if _GROUPED_MM is not None and (rows.device.type == "cpu" or rows.dtype == torch.bfloat16):
        return _GROUPED_MM(rows, weights, offs=offs)
    pieces = rows.split(counts)
    return torch.cat([piece @ weights[e] for e, piece in enumerate(pieces)])


def _stacked(experts: Any, name: str) -> torch.Tensor:
    """The experts' ``name`` weights ``[out, in]`` stacked and transposed to ``[E, in, out]``."""
    return torch.stack([getattr(expert, name).weight for expert in experts]).transpose(1, 2)


def grouped_expert_slots(
    layer: Any,
    tokens: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """The layer's experts on their tokens by grouped GEMMs (module docstring).

    Args:
        layer: the MoE layer (its ``experts``, ``topk``, ``num_experts``).
        tokens: ``[T, hidden]``.
        weights: ``[T, k]`` routing weights (zero where dropped).
        experts: ``[T, k]`` the expert of each slot.
        keep: ``[T, k]`` False where an assignment is dropped.

    Returns:
        ``[T, k, hidden]``: slot ``j`` of token ``t`` holds ``w[t, j] * expert_{e[t, j]}(x_t)``
        (zeros for dropped assignments).
    """
    t, k = experts.shape
    flat = experts.reshape(-1)
    kept = keep.reshape(-1).nonzero(as_tuple=True)[0]  # assignment ids, ascending
    order = kept[torch.sort(flat[kept], stable=True).indices]  # by expert, then (token, slot)
    sizes = torch.bincount(flat[order], minlength=layer.num_experts)
    offs = sizes.cumsum(0).to(torch.int32)
    counts = sizes.tolist()
    rows = tokens.index_select(0, order // k)
    activation = layer.experts[0].activation
    act = ACTIVATION_FUNCTIONS[activation]

    def project(x: torch.Tensor, name: str) -> torch.Tensor:
        return _grouped_matmul(x, _stacked(layer.experts, name), counts, offs)

    if activation in GATED_ACTIVATIONS:
        y = project(act(project(rows, "w1")) * project(rows, "w3"), "w2")
    else:
        y = project(act(project(rows, "fc1")), "fc2")
    y = (y * weights.reshape(-1)[order].unsqueeze(-1)).to(tokens.dtype)
    if order.numel() == t * k:  # dropless: every slot's row, gathered back (no zero fill)
        inverse = torch.empty_like(order).scatter_(
            0, order, torch.arange(t * k, device=order.device)
        )
        return y.index_select(0, inverse).view(t, k, -1)
    slots = tokens.new_zeros((t * k, tokens.shape[-1]))
    return slots.index_copy(0, order, y).view(t, k, -1)
