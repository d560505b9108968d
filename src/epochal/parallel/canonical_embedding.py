"""Embedding lookups in canonical units: the table's gradient in the folded tree of sequence chunks.

An embedding's weight gradient adds, for every row, the output gradients of the
tokens that looked it up; context parallelism splits those tokens over ranks, so
the plain backward (each rank's rows summed, then all-reduced) adds them in
another order than one process. Here each folded sequence chunk
(:mod:`epochal.parallel.canonical`; the weight gradients' ``2 C`` of them) adds its own tokens' gradients row by row in
token order (the same call on every layout: ``index_add_`` over the chunk's
``[b, s / 2D]`` tokens), as a sparse partial (the rows it touched and their
sums); the chunks' partials are added as the folded tree (a row missing from a
partial counts as zero, which adds exactly), made dense and completed over the
context-parallel group by recursive halving.

Two kinds of table:

- the token embedding, vocabulary-parallel under tensor parallelism (this rank's
  rows ``[V / n, h]``, Megatron's ``VocabParallelEmbedding``): ids outside the
  rank's rows look up zeros, and the ranks' outputs are summed (one value and
  zeros: exact in any order), or reduce-scattered over the sequence under sequence
  parallelism;
- a replicated table (learned absolute positions): every rank looks up all of its
  tokens; under sequence parallelism the output is this rank's slice of the
  sequence and the backward gathers the slices' gradients first, so every rank
  adds the whole sequence's.

Shapes: ids int64 ``[b or 1, s]``; output ``[b or 1, s, h]`` (``s / n`` under
sequence parallelism).
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.parallel.canonical import (
    Reductions,
    folded_tree,
    sequence_all_gather,
    sequence_chunks,
    tree_all_reduce,
    tree_reduce_scatter,
)

__all__ = ["install_canonical_embedding"]

Sparse = tuple[torch.Tensor, torch.Tensor]  # (sorted unique rows [u], their sums [u, h])


def _add_sparse(left: Sparse, right: Sparse) -> Sparse:
    """Two partials' sum: rows in both are added once (``0 + a + b``: the bits of ``a + b``)."""
    rows, where = torch.unique(torch.cat([left[0], right[0]]), return_inverse=True)
    sums = left[1].new_zeros((rows.numel(), left[1].shape[-1]))
    sums.index_add_(0, where, torch.cat([left[1], right[1]]))
    return rows, sums


def _chunk_partial(ids: torch.Tensor, grad: torch.Tensor) -> Sparse:
    """The rows ``ids`` ``[N]`` touch and their gradients ``grad`` ``[N, h]`` added in token order."""
    rows, where = torch.unique(ids, return_inverse=True)
    sums = grad.new_zeros((rows.numel(), grad.shape[-1]))
    sums.index_add_(0, where, grad)
    return rows, sums


class _CanonicalEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        ids: torch.Tensor,
        weight: torch.Tensor,
        red: Reductions,
        vocab_parallel: bool,
        sequence_parallel: bool,
    ) -> torch.Tensor:
        rows = weight.shape[0]
        local = ids - red.rank * rows if vocab_parallel else ids
        inside = (local >= 0) & (local < rows)
        local = local.masked_fill(~inside, 0)
        out = F.embedding(local, weight).masked_fill(~inside.unsqueeze(-1), 0.0)
        if vocab_parallel and red.group is not None:
            if sequence_parallel:
                out = tree_reduce_scatter(out, 1, red)
            else:
                out = tree_all_reduce(out, red)
        elif sequence_parallel and red.group is not None:
            s = out.shape[1] // red.size
            out = out[:, red.rank * s : (red.rank + 1) * s].contiguous()
        ctx.save_for_backward(local, inside)
        ctx.red, ctx.sp, ctx.shape = red, sequence_parallel, weight.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        local, inside = ctx.saved_tensors
        red: Reductions = ctx.red
        if ctx.sp and red.group is not None:
            grad = sequence_all_gather(grad.contiguous(), 1, red)
        n = sequence_chunks(local, red, weights=True)
        width = local.shape[1] // n

        def partial(i: int) -> Sparse:
            cut = slice(i * width, (i + 1) * width)
            keep = inside[:, cut].reshape(-1)
            ids = local[:, cut].reshape(-1)[keep]
            values = grad[:, cut].reshape(-1, grad.shape[-1])[keep]
            return _chunk_partial(ids, values)

        def leaf(j: int, mirror: int | None) -> Sparse:
            return partial(j) if mirror is None else _add_sparse(partial(j), partial(mirror))

        rows, sums = folded_tree(leaf, n, _add_sparse)
        dense = grad.new_zeros(ctx.shape)
        dense.index_copy_(0, rows, sums)
        if red.cp is not None:
            dense = tree_all_reduce(dense, red.cp)
        return None, dense, None, None, None


def _embedding_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    weight = self.weight.to_local() if isinstance(self.weight, DTensor) else self.weight
    options = self.canonical_options
    return _CanonicalEmbedding.apply(
        ids, weight, self.canonical_reductions, options["vocab_parallel"], options["sp"]
    )


def install_canonical_embedding(
    module: nn.Embedding, red: Reductions, *, vocab_parallel: bool, sequence_parallel: bool
) -> None:
    """Make ``module`` look up in canonical units (module docstring).

    Args:
        module: the embedding (its weight this rank's ``[V / n, h]`` rows when
            ``vocab_parallel``, else the whole table).
        red: the units.
        vocab_parallel: the rows are split over the tensor-parallel group.
        sequence_parallel: return this rank's sequence slice.
    """
    if module.padding_idx is not None or module.max_norm is not None:
        raise ValueError("canonical embeddings take no padding_idx or max_norm")
    module.canonical_reductions = red
    module.canonical_options = {"vocab_parallel": vocab_parallel, "sp": sequence_parallel}
    module.forward = types.MethodType(_embedding_forward, module)
