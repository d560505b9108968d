"""The model's reductions in canonical units (:mod:`epochal.parallel.canonical`): linears, norms, loss.

Each function computes what its plain counterpart computes, with every sum over a
dimension that tensor or sequence parallelism may split cut into the ``D``
canonical chunks and added as the canonical tree, and every product whose
reduction is not split run in the same chunk shapes, so that a kernel call on
one rank is a kernel call of one process. Shapes (``N`` tokens, ``L = D / n``
chunks held by this rank of an ``n``-rank group):

- :func:`column_linear`: ``x [..., K]`` (whole) times this rank's rows of
  ``W [M, K]`` -> ``[..., M / n]``; one ``[N, K] x [K, M / D]`` product per
  chunk; the input gradient (a sum over the output width) as the tree over the
  ``D`` chunks and the group (reduce-scattered over the sequence and padded with
  zeros to the whole sequence when the input was gathered: see
  :func:`gather_sequence`).
- :func:`row_linear`: this rank's ``[..., K / n]`` times its columns of
  ``W [M, K]`` -> ``[..., M]``, the sum over the input width as the tree (all
  ranks keep the whole output, or their sequence slice under sequence
  parallelism).
- :func:`scale_shift`: a norm's ``xhat * weight (+ bias)``; the parameter
  gradients are token sums in canonical sequence chunks (over the group's
  sequence slices under sequence parallelism).
- :func:`canonical_cross_entropy`: per-token cross-entropy of ``[..., V / n]``
  logit shards: the max over the vocabulary (exact in any order), the sum of
  exponentials per vocabulary chunk added as the tree.

Weight gradients sum over the tokens: one product per leaf of the folded tree, a
sequence chunk and its mirror (``C`` leaves in one process, ``C / cp`` on a
context-parallel rank, ``C`` the invariant context degree; the same ``[b, 2 s / 2C]``
tokens on every layout, a rank with ``C = cp`` reading its own tokens in place), the
leaves added as the folded tree and completed over the context-parallel group
(:func:`~epochal.parallel.canonical.folded_token_sum`). Tensor and sequence
parallelism give each rank all of its context-parallel rank's tokens there.
"""

from __future__ import annotations

from typing import Any

import torch

from epochal.parallel.canonical import (
    Reductions,
    sequence_all_gather,
    sequence_chunks,
    token_chunk_sum,
    tree_all_reduce,
    tree_reduce_scatter,
    tree_sum,
)
from epochal.parallel.canonical_step_sum import LeafSink, weight_gradient

__all__ = [
    "add_vocabulary_bias",
    "canonical_cross_entropy",
    "column_linear",
    "gather_sequence",
    "head_scale_shift",
    "keep_sequence_slice",
    "row_linear",
    "scale_shift",
]


def _chunks_first(t2: torch.Tensor, chunks: int) -> torch.Tensor:
    """``[N, chunks * w]`` -> ``[chunks, N, w]`` with the row-major strides of its shape.

    A copy into fresh memory, not ``contiguous()``: with ``N = 1`` (a decoding step)
    the transposed view already counts as contiguous but keeps the stride of the
    ``chunks``, and the batched product then reads it by another path whose bits
    depend on ``chunks``, which differs between layouts.
    """
    n, width = t2.shape
    view = t2.view(n, chunks, width // chunks).transpose(0, 1)
    return torch.empty(view.shape, dtype=t2.dtype, device=t2.device).copy_(view)


def _chunks_last(t3: torch.Tensor) -> torch.Tensor:
    """contiguous ``[chunks, N, w]`` -> ``[N, chunks * w]``."""
    chunks, n, width = t3.shape
    return t3.transpose(0, 1).reshape(n, chunks * width)


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[b, s, C]`` (a 2-D ``[N, C]`` is one sequence of ``N`` tokens)."""
    return t.unsqueeze(0) if t.dim() == 2 else t.reshape(t.shape[0], -1, t.shape[-1])


def _chunk_rows(t3: torch.Tensor, i: int, chunks: int) -> torch.Tensor:
    """Sequence chunk ``i`` of ``chunks`` of ``t3`` ``[b, s, C]`` as row-major ``[b * s / chunks, C]``.

    A view where the chunk already is row-major memory aligned to 64 bytes (one
    sequence, contiguous), else a copy into fresh (aligned) memory: a kernel then
    reads every chunk the same way, wherever the chunk sits in a rank's tensor.
    """
    width = t3.shape[1] // chunks
    piece = t3[:, i * width : (i + 1) * width]
    if t3.shape[0] == 1 and t3.is_contiguous() and piece.data_ptr() % 64 == 0:
        return piece.view(-1, t3.shape[-1])
    out = torch.empty((piece.shape[0] * width, t3.shape[-1]), dtype=t3.dtype, device=t3.device)
    return out.view(piece.shape).copy_(piece).view(-1, t3.shape[-1])


def _pair_rows(t3: torch.Tensor, j: int, mirror: int | None, chunks: int) -> torch.Tensor:
    """Sequence chunks ``j`` and ``mirror`` of ``chunks`` of ``t3`` ``[b, s, C]``, as row-major rows.

    Each sequence's chunk ``j`` then its chunk ``mirror`` (``[b * 2 s / chunks, C]``;
    ``mirror`` None: chunk ``j`` alone, :func:`_chunk_rows`). A weight gradient's leaf of
    the folded tree is one product over these rows: a context-parallel rank holding
    exactly the pair (``chunks = 2``: its two chunks back to back) reads its own tokens in
    place, with one product as a plain linear makes; other layouts copy the pair into
    fresh memory of the same layout, so the kernel reads the same rows the same way.
    """
    if mirror is None:
        return _chunk_rows(t3, j, chunks)
    if chunks == 2 and (j, mirror) == (0, 1) and t3.is_contiguous() and t3.data_ptr() % 64 == 0:
        return t3.view(-1, t3.shape[-1])
    width = t3.shape[1] // chunks
    out = torch.empty((t3.shape[0], 2 * width, t3.shape[-1]), dtype=t3.dtype, device=t3.device)
    out[:, :width] = t3[:, j * width : (j + 1) * width]
    out[:, width:] = t3[:, mirror * width : (mirror + 1) * width]
    return out.view(-1, t3.shape[-1])


def _column_bias_grad(
    grad3: torch.Tensor, red: Reductions, chunks: int, complete: bool = True
) -> torch.Tensor:
    """A bias gradient over ``grad3`` ``[b, s, W]``'s tokens, per ``W / chunks`` columns (the canonical width)."""
    parts = grad3.chunk(chunks, -1)
    sums = [token_chunk_sum(p.contiguous(), red, sharded=False, complete=complete) for p in parts]
    return torch.cat(sums)


def _pad_sequence(local: torch.Tensor, red: Reductions) -> torch.Tensor:
    """This rank's sequence slice placed in zeros of the whole sequence (dim 1)."""
    whole = local.new_zeros((local.shape[0], local.shape[1] * red.size, *local.shape[2:]))
    s = local.shape[1]
    whole[:, red.rank * s : (red.rank + 1) * s] = local
    return whole


class _ColumnLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        red: Reductions,
        gathered: bool,
        complete: tuple[bool, bool],
    ) -> torch.Tensor:
        k = x.shape[-1]
        chunks = red.local
        x2 = x.reshape(-1, k)
        w3 = weight.view(chunks, weight.shape[0] // chunks, k)
        out3 = torch.bmm(x2.unsqueeze(0).expand(chunks, -1, -1), w3.transpose(1, 2))
        out = _chunks_last(out3).view(*x.shape[:-1], weight.shape[0])
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(x, weight)
        ctx.red, ctx.gathered, ctx.has_bias = red, gathered, bias is not None
        ctx.complete = complete
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        red: Reductions = ctx.red
        chunks, k = red.local, x.shape[-1]
        w3 = weight.view(chunks, weight.shape[0] // chunks, k)
        g3 = _chunks_first(grad.reshape(-1, weight.shape[0]), chunks)  # [L, N, M / D]
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            local = tree_sum(torch.bmm(g3, w3)).view(x.shape)
            if ctx.gathered:
                grad_x = _pad_sequence(tree_reduce_scatter(local, 1, red), red)
            else:
                grad_x = tree_all_reduce(local, red)
        if ctx.needs_input_grad[1]:
            x3, gt = _tokens(x), _tokens(grad)
            n = sequence_chunks(x3, red, weights=True)

            def leaf(j: int, mirror: int | None) -> torch.Tensor:  # chunks j + mirror: [M / n, K]
                return _pair_rows(gt, j, mirror, n).t() @ _pair_rows(x3, j, mirror, n)

            grad_w = weight_gradient(leaf, red, n, ctx.complete[0])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = _column_bias_grad(_tokens(grad), red, chunks, ctx.complete[1])
        return grad_x, grad_w, grad_b, None, None, None


class _RowLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        red: Reductions,
        scatter: bool,
        complete: bool,
    ) -> torch.Tensor:
        chunks, m = red.local, weight.shape[0]
        x3 = _chunks_first(x.reshape(-1, x.shape[-1]), chunks)  # [L, N, K / D]
        w3 = _chunks_first(weight, chunks)  # [L, M, K / D]
        out = tree_sum(torch.bmm(x3, w3.transpose(1, 2))).view(*x.shape[:-1], m)
        # the input and the weight themselves (the weight is a parameter, the input what
        # a plain linear keeps); their chunked copies are made again in the backward
        ctx.save_for_backward(x, weight)
        ctx.red, ctx.scatter, ctx.x_shape, ctx.complete = red, scatter, x.shape, complete
        return tree_reduce_scatter(out, 1, red) if scatter else tree_all_reduce(out, red)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        red: Reductions = ctx.red
        w3 = _chunks_first(weight, red.local)  # [L, M, K / D]
        if ctx.scatter:
            grad = sequence_all_gather(grad, 1, red)
        chunks, m = red.local, w3.shape[1]
        g2 = grad.reshape(-1, m)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            gx3 = torch.bmm(g2.unsqueeze(0).expand(chunks, -1, -1), w3)
            grad_x = _chunks_last(gx3).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            xt, gt = _tokens(x), _tokens(grad)
            n = sequence_chunks(xt, red, weights=True)

            def leaf(
                j: int, mirror: int | None
            ) -> torch.Tensor:  # chunks j + mirror: [L, M, K / D]
                gi = _pair_rows(gt, j, mirror, n).t().unsqueeze(0).expand(chunks, -1, -1)
                return torch.bmm(gi, _chunks_first(_pair_rows(xt, j, mirror, n), chunks))

            grad_w = weight_gradient(leaf, red, n, ctx.complete, _chunks_last)
        return grad_x, grad_w, None, None, None


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, red: Reductions) -> torch.Tensor:
        ctx.red, ctx.length = red, local.shape[1]
        return sequence_all_gather(local, 1, red)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        red, s = ctx.red, ctx.length
        return grad[:, red.rank * s : (red.rank + 1) * s].contiguous(), None


class _ScaleShift(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        xhat: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        red: Reductions,
        sharded: bool,
        complete: tuple[bool, bool],
    ) -> torch.Tensor:
        out = xhat if weight is None else xhat * weight
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(xhat, weight)
        ctx.red, ctx.sharded, ctx.has_bias = red, sharded, bias is not None
        ctx.complete = complete
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        xhat, weight = ctx.saved_tensors
        red, sharded = ctx.red, ctx.sharded
        grad_x = grad if weight is None else grad * weight
        grad_w = grad_b = None
        cw, cb = ctx.complete
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = token_chunk_sum(grad * xhat, red, sharded=sharded, complete=cw)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = token_chunk_sum(grad, red, sharded=sharded, complete=cb)
        return grad_x, grad_w, grad_b, None, None, None


def _head_sum(values: torch.Tensor, red: Reductions) -> torch.Tensor:
    """``[b, s, heads_local, hd]`` summed to ``[hd]``: per head in the folded chunks, then over every head.

    Each head's sum over its tokens is the token sum of a norm (the same call on
    every layout, on a contiguous copy); the heads' sums are gathered over the
    tensor-parallel group in global head order and added in that order.
    """
    per_head = torch.stack(
        [
            token_chunk_sum(values[:, :, j].contiguous(), red, sharded=False)
            for j in range(values.shape[2])
        ]
    )
    if red.group is not None:
        per_head = sequence_all_gather(per_head, 0, red)
    return per_head.sum(0)  # [heads, hd] on every layout: one call, one order


class _HeadScaleShift(torch.autograd.Function):
    """QK-norm's affine step over ``[b, s, heads_local, hd]`` (weight, bias ``[hd]``)."""

    @staticmethod
    def forward(
        ctx: Any,
        xhat: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        red: Reductions,
    ) -> torch.Tensor:
        out = xhat * weight
        if bias is not None:
            out = out + bias
        ctx.save_for_backward(xhat, weight)
        ctx.red, ctx.has_bias = red, bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        xhat, weight = ctx.saved_tensors
        # the gradient arrives in the attention's [b, heads, s, hd] memory order, a layout
        # that depends on the heads a rank holds; the norm's backward (a reduction over
        # head_dim) is then computed in one fixed layout
        grad = grad.contiguous()
        grad_w = grad_b = None
        if ctx.needs_input_grad[1]:
            grad_w = _head_sum(grad * xhat, ctx.red)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = _head_sum(grad, ctx.red)
        return grad * weight, grad_w, grad_b, None


def head_scale_shift(
    xhat: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, red: Reductions
) -> torch.Tensor:
    """QK-norm's ``xhat * weight + bias`` per head, its parameter gradients summed over every head.

    The norm's weight is shared by the heads that tensor parallelism splits: each
    head's gradient is a token sum in the canonical chunks, and the heads' are added
    in global head order after a gather over the group, so every layout adds them alike.

    Args:
        xhat: the normalized ``[b, s, heads_local, head_dim]`` queries or keys.
        weight, bias: ``[head_dim]`` (bias None for RMSNorm).
        red: the canonical units.
    """
    return _HeadScaleShift.apply(xhat, weight, bias, red)


def _autocast(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The tensors in the autocast dtype when autocast is on (a differentiable cast), else as given.

    The products below are custom autograd functions: autocast casts their forward's
    operands, not their backward's, so the cast happens here, before the function, and
    both passes run in one dtype (the gradients flow back through the casts).
    """
    first = next(t for t in tensors if t is not None)
    device = first.device.type
    if not torch.is_autocast_enabled(device):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device)
    return [None if t is None else t.to(dtype) for t in tensors]


def column_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    red: Reductions,
    *,
    gathered: bool = False,
    complete: tuple[bool | LeafSink, bool] = (True, True),
) -> torch.Tensor:
    """``x @ weight.T + bias`` for this rank's rows of the weight (module docstring).

    Args:
        x: ``[..., K]``, whole on every rank (``[b, s, K]`` gathered when ``gathered``).
        weight: this rank's ``[M / n, K]`` (``M / D`` rows per chunk).
        bias: this rank's ``[M / n]`` or None.
        red: the canonical units.
        gathered: ``x`` came from :func:`gather_sequence` (its gradient is
            reduce-scattered over the sequence, zeros elsewhere).
        complete: whether the weight's and the bias's gradients are completed over
            the context-parallel group here (False: by the caller,
            :mod:`epochal.parallel.canonical_deferred`); for the weight also a
            :class:`~epochal.parallel.canonical_step_sum.LeafSink` that accumulates
            its sequence chunks' products over the step (the op returns no gradient).

    Returns:
        ``[..., M / n]``.
    """
    x, weight, bias = _autocast(x, weight, bias)
    return _ColumnLinear.apply(x, weight, bias, red, gathered, complete)


def row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    red: Reductions,
    *,
    scatter: bool = False,
    complete: bool | LeafSink = True,
) -> torch.Tensor:
    """``x @ weight.T`` summed over the input width in canonical chunks and over the group.

    Args:
        x: this rank's ``[b, s, K / n]``.
        weight: this rank's ``[M, K / n]``.
        red: the canonical units.
        scatter: keep this rank's sequence slice (sequence parallelism) instead of
            the whole output.
        complete: the weight's gradient is completed over the context-parallel
            group here (as :func:`column_linear`).

    Returns:
        ``[b, s, M]`` or ``[b, s / n, M]`` with ``scatter``.
    """
    x, weight = _autocast(x, weight)
    return _RowLinear.apply(x, weight, red, scatter, complete)


def gather_sequence(local: torch.Tensor, red: Reductions) -> torch.Tensor:
    """This rank's sequence slice ``[b, s / n, ...]`` joined into ``[b, s, ...]``.

    The backward keeps this rank's slice of the gradient: the column linears that
    read the gathered tensor have already summed their input gradients over the
    group and padded them with zeros to the whole sequence.
    """
    return _GatherSequence.apply(local, red) if red.group is not None else local


class _KeepSlice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, whole: torch.Tensor, red: Reductions) -> torch.Tensor:
        ctx.red = red
        s = whole.shape[1] // red.size
        return whole[:, red.rank * s : (red.rank + 1) * s].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return sequence_all_gather(grad, 1, ctx.red), None


def keep_sequence_slice(whole: torch.Tensor, red: Reductions) -> torch.Tensor:
    """This rank's slice ``[b, s / n, ...]`` of a tensor every rank computed whole ``[b, s, ...]``.

    The backward gathers the slices' gradients, so that the whole computation before
    it (an encoder's embedding stage, replicated) gets the whole gradient on every
    rank, as one process does.
    """
    return _KeepSlice.apply(whole, red) if red.group is not None else whole


def scale_shift(
    xhat: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    red: Reductions,
    *,
    sharded: bool,
    complete: tuple[bool, bool] = (True, True),
) -> torch.Tensor:
    """A norm's affine step ``xhat * weight + bias`` with canonical parameter gradients.

    Args:
        xhat: the normalized ``[b, s_local, C]``.
        weight, bias: ``[C]`` or None.
        red: the canonical units.
        sharded: ``xhat`` is this rank's sequence slice (sequence parallelism).
        complete: as :func:`column_linear`'s.
    """
    return _ScaleShift.apply(xhat, weight, bias, red, sharded, complete)


class _CanonicalCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, labels: torch.Tensor, red: Reductions, vocab: int | None
    ) -> torch.Tensor:
        local_v = logits.shape[-1]
        start = red.rank * local_v
        values = logits.float()
        if vocab is not None and start + local_v > vocab:
            columns = torch.arange(start, start + local_v, device=logits.device)
            values = values.masked_fill(columns >= vocab, float("-inf"))
        top = values.max(dim=-1).values
        if red.group is not None:
            torch.distributed.all_reduce(top, op=torch.distributed.ReduceOp.MAX, group=red.group)
        shifted = values - top.unsqueeze(-1)
        exp = shifted.exp()
        flat = exp.reshape(-1, local_v)
        sums = torch.stack([part.contiguous().sum(-1) for part in flat.chunk(red.local, -1)])
        local_labels = labels - start
        outside = (local_labels < 0) | (local_labels >= local_v)
        local_labels = local_labels.masked_fill(outside, 0)
        target = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1)
        target = target.masked_fill(outside, 0.0)
        stacked = torch.stack([tree_sum(sums).view(target.shape), target])
        stacked = tree_all_reduce(stacked, red)
        sum_exp, target = stacked[0], stacked[1]
        ctx.save_for_backward(exp, sum_exp, local_labels, outside)
        return sum_exp.log() - target

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[Any, ...]:
        exp, sum_exp, local_labels, outside = ctx.saved_tensors
        grad = exp / sum_exp.unsqueeze(-1)
        inside = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_labels.unsqueeze(-1), -inside.unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


class _AddVocabularyBias(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, bias: torch.Tensor, red: Reductions, chunks: int
    ) -> torch.Tensor:
        ctx.red, ctx.chunks, ctx.dtypes = red, chunks, (logits.dtype, bias.dtype)
        return logits + bias  # the promoted dtype, as the plain addition

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        grad_bias = _column_bias_grad(_tokens(grad), ctx.red, ctx.chunks)
        return grad.to(ctx.dtypes[0]), grad_bias.to(ctx.dtypes[1]), None, None


def add_vocabulary_bias(
    logits: torch.Tensor, bias: torch.Tensor, red: Reductions, vocab: int
) -> torch.Tensor:
    """``logits + bias`` over (a shard of) the vocabulary, the bias gradient in canonical chunks.

    Args:
        logits: ``[..., W]``, ``W`` this rank's ``V / n`` columns or all ``V``.
        bias: ``[W]``, the same columns.
        red: the units.
        vocab: ``V``, the whole (padded) vocabulary: the bias gradient is a token sum
            per ``V / D`` columns, the same width on every layout.
    """
    chunks = logits.shape[-1] // red.chunk_width(vocab, "the padded vocabulary")
    return _AddVocabularyBias.apply(logits, bias, red, chunks)


def canonical_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, red: Reductions, vocab: int | None = None
) -> torch.Tensor:
    """Per-token cross-entropy of vocabulary shards, the softmax's sum in canonical chunks.

    Args:
        logits: this rank's ``[..., V / n]`` (the whole ``[..., V]`` on one rank).
        labels: int64 ``[...]``, global vocabulary ids.
        red: the canonical units (``V`` splits into ``D`` chunks).
        vocab: the columns inside the softmax (padded columns beyond are left out),
            or None for all.

    Returns:
        float32 ``[...]``, the same on every rank of the group.
    """
    return _CanonicalCrossEntropy.apply(logits, labels, red, vocab)
