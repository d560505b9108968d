"""Canonical reduction units: every sum over a split dimension in ``degree`` fixed chunks, one fixed tree.

Tensor and sequence parallelism cut a model's reductions across ranks: a
row-parallel product sums over its input width, a column-parallel input gradient
over its output width, a norm's weight gradient over the tokens of a sequence
shard, the cross-entropy's softmax over the vocabulary. Floating-point addition is
not associative, so a sum split over two ranks and then all-reduced is not the
sum one process computes, and the runs drift apart.

The invariance degree ``D`` (``parallel.invariant_degree``, a power of two) fixes
the units: every such dimension is cut into ``D`` equal chunks whatever the
layout, each chunk reduced by the same kernel call shape, and the ``D`` partial
results added as one balanced binary tree over adjacent chunks::

    ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7))        D = 8

A tensor-parallel group of ``n`` ranks (``n`` divides ``D``) holds ``D / n``
adjacent chunks per rank, so each rank first adds its own chunks as a subtree
(:func:`tree_sum`) and the ranks then complete the tree over the group
(:func:`tree_all_reduce`, :func:`tree_reduce_scatter`) by recursive halving: at
step ``k`` rank ``r`` exchanges half of what it holds with rank ``r ^ 2**k`` and
adds, which is exactly the tree's next level (addition is commutative, so
``a + b`` is the same bits on either rank). The bytes each rank sends are those
of a ring all-reduce (``2 (n - 1) / n`` of the tensor; ``(n - 1) / n`` for the
reduce-scatter), issued as point-to-point messages that the communication
ledger counts (:mod:`epochal.parallel.comm_ledger`). A group of two ranks has one
level, ``r0 + r1``: any all-reduce of two operands adds each element once and
commutativity makes the order moot, so the library's own all-reduce and
reduce-scatter compute it (the same bytes, one call: gloo's all-reduce of a
model's gradients was 4x faster than the exchange and gather on a 2-core machine). One process runs the same
tree over all ``D`` chunks, so one process and every group size that divides
``D`` compute the same bits.

Because ``D`` is a power of two, every size that divides it is one too, and the
pairing above always exists; an uneven group never arises.

Sums over tokens (weight, bias and norm gradients, which context and sequence
parallelism split) use ``2 D`` sequence chunks in the *folded* order: leaf ``p``
(``p < D``) is chunk ``p`` plus its mirror chunk ``2 D - 1 - p``, and the ``D``
leaves are added as the tree above (:func:`folded_tree`). A context-parallel rank
``r`` of ``cp`` holds the sequence chunks ``r`` and ``2 cp - 1 - r`` of the
load-balanced cut, i.e. exactly the leaves ``[r D / cp, (r + 1) D / cp)``: its
subtree, which the context-parallel group completes by recursive halving
(:func:`folded_token_sum`; in the op, or for a whole micro-batch after its backward,
:mod:`epochal.parallel.canonical_deferred`). One process, every context-parallel size dividing
``D`` and every sequence-parallel split therefore add the same partial sums in
the same tree.

Errors: :class:`ValueError` when the group size does not divide the degree, the
degree is not a power of two, or a tensor's dimension does not split into the
chunks asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "Reductions",
    "folded_token_sum",
    "folded_tree",
    "sequence_all_gather",
    "sequence_chunks",
    "start_tree_all_reduce",
    "token_chunk_sum",
    "tree_all_reduce",
    "tree_reduce_scatter",
    "tree_sum",
]


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


class Reductions:
    """The canonical units of one run: the degree and the group that splits them.

    Args:
        degree: the invariance degree ``D`` (a power of two).
        group: the tensor-parallel process group, or None for one rank.
        cp_group: the context-parallel process group, or None without.
        context_degree: ``parallel.invariant_context_degree`` ``C``: the weight
            gradients' token sums use ``2 C`` sequence chunks (a multiple of the
            context-parallel size).

    Attributes:
        degree: ``D``.
        group: the group (None for one rank).
        size: the group's size ``n`` (1 without a group).
        rank: this rank's index in the group.
        local: the chunks this rank holds of a split dimension (``D / n``).
        cp: the context-parallel group's units (None without context parallelism).
        token_chunks: the folded sequence chunks this rank's sequence holds for
            the token sums of vectors (norm and bias gradients: ``2 D / cp``; a
            tensor-parallel rank's slice of it under sequence parallelism holds
            ``1 / n`` of them).
        weight_chunks: the same for weight gradients (``2 C / cp``; 1 when ``C = 1``:
            the whole sequence).

    Raises:
        ValueError: ``degree`` is not a power of two, or ``n`` (or the
        context-parallel size) does not divide it.
    """

    def __init__(
        self,
        degree: int,
        group: dist.ProcessGroup | None = None,
        cp_group: dist.ProcessGroup | None = None,
        context_degree: int = 1,
    ) -> None:
        if not _power_of_two(degree):
            raise ValueError(f"parallel.invariant_degree must be a power of two, got {degree}")
        size = dist.get_world_size(group) if group is not None else 1
        if degree % size:
            raise ValueError(
                f"parallel.invariant_degree={degree} is not a multiple of the "
                f"tensor-parallel size {size}: every size that gives the same bits divides it"
            )
        self.degree = degree
        self.group = group if size > 1 else None
        self.size = size
        self.rank = dist.get_rank(group) if self.group is not None else 0
        self.local = degree // size
        cp = dist.get_world_size(cp_group) if cp_group is not None else 1
        if degree % cp:  # the norm and bias gradients' token sums: 2 D chunks over the group
            raise ValueError(
                f"parallel.invariant_degree={degree} is not a multiple of context_parallel={cp}: "
                "the token sums of norm and bias gradients cut the sequence into 2 x "
                "invariant_degree chunks, whole ones on every rank"
            )
        self.cp = Reductions(degree, cp_group) if cp > 1 else None
        self.cp_size = cp
        self.cp_rank = self.cp.rank if self.cp is not None else 0
        if not _power_of_two(context_degree) or context_degree % cp:
            raise ValueError(
                f"parallel.invariant_context_degree={context_degree} is not a power of two "
                f"and a multiple of context_parallel={cp}"
            )
        self.context_degree = context_degree
        self.token_chunks = 2 * degree // cp
        # C = 1 (no context parallelism to match): the whole sequence, one product
        self.weight_chunks = 2 * context_degree // cp if context_degree > 1 else 1

    def chunk_width(self, full: int, what: str) -> int:
        """The width of one chunk of a dimension of ``full`` elements (whole, not this rank's)."""
        if full % self.degree:
            raise ValueError(
                f"{what} ({full}) does not split into parallel.invariant_degree={self.degree} chunks"
            )
        return full // self.degree

    def __deepcopy__(self, memo: dict[int, object]) -> Reductions:
        """The same units: a copied model computes in the same group (a handle, not state)."""
        return self

    def __repr__(self) -> str:
        return (
            f"Reductions(degree={self.degree}, size={self.size}, rank={self.rank}, "
            f"cp_size={self.cp_size}, cp_rank={self.cp_rank}, "
            f"context_degree={self.context_degree})"
        )


def tree_sum(stack: torch.Tensor) -> torch.Tensor:
    """The balanced binary tree sum of ``stack``'s leading dimension (adjacent pairs first).

    Args:
        stack: ``[L, ...]`` with ``L`` a power of two.

    Returns:
        ``[...]``: ``stack[0] + stack[1]`` at the first level, and so on.
    """
    if not _power_of_two(stack.shape[0]):
        raise ValueError(f"a tree sum needs a power-of-two count of parts, got {stack.shape[0]}")
    while stack.shape[0] > 1:
        stack = stack[0::2] + stack[1::2]
    return stack[0]


def _exchange(send: torch.Tensor, partner: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Send ``send`` to group rank ``partner`` and receive its tensor of the same shape."""
    recv = torch.empty_like(send)
    peer = dist.get_global_rank(group, partner)
    ops = [
        dist.P2POp(dist.isend, send, peer, group),
        dist.P2POp(dist.irecv, recv, peer, group),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return recv


def _halve(pieces: torch.Tensor, red: Reductions) -> torch.Tensor:
    """Recursive halving over ``pieces`` ``[n, m]``: returns this rank's piece ``[m]``, tree-summed."""
    assert red.group is not None
    keep = list(range(red.size))
    held = pieces
    bit = 1
    while bit < red.size:
        mine = [i for i, p in enumerate(keep) if p & bit == red.rank & bit]
        theirs = [i for i, p in enumerate(keep) if p & bit != red.rank & bit]
        send = held[theirs].contiguous()
        recv = _exchange(send, red.rank ^ bit, red.group)
        held = held[mine] + recv
        keep = [keep[i] for i in mine]
        bit <<= 1
    return held[0]


def tree_all_reduce(local: torch.Tensor, red: Reductions) -> torch.Tensor:
    """The tree sum over the group of every rank's subtree ``local`` (the same bits on every rank).

    Args:
        local: this rank's subtree (any shape, the same on every rank), a temporary of
            the caller's: in a group of two the sum is written into it when it is
            contiguous (no second buffer of a weight gradient's size).
        red: the units (its group; one rank returns ``local``).

    Returns:
        A tensor shaped like ``local``.
    """
    return start_tree_all_reduce(local, red, async_op=False)()


def start_tree_all_reduce(
    local: torch.Tensor, red: Reductions, *, async_op: bool = True
) -> Callable[[], torch.Tensor]:
    """:func:`tree_all_reduce` started now and finished by the returned function (call it once).

    In a group of two the library's all-reduce runs in the background (``async_op``)
    until the function waits for it, so several completions can be in flight at once;
    larger groups run the recursive halving when the function is called. The bits are
    :func:`tree_all_reduce`'s either way.
    """
    if red.group is None:
        return lambda: local
    if red.size == 2:  # one level: r0 + r1 (module docstring)
        out = local if local.is_contiguous() else local.contiguous()
        work = dist.all_reduce(out, group=red.group, async_op=async_op)

        def finish() -> torch.Tensor:
            if work is not None:
                work.wait()
            return out

        return finish
    return lambda: _halving_all_reduce(local, red)


def _halving_all_reduce(local: torch.Tensor, red: Reductions) -> torch.Tensor:
    """:func:`tree_all_reduce` in a group of four or more: halving, then an all-gather."""
    flat = local.reshape(-1)
    n = red.size
    pad = (-flat.numel()) % n
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    piece = _halve(flat.view(n, -1), red)
    whole = torch.empty(n * piece.numel(), dtype=piece.dtype, device=piece.device)
    dist.all_gather_into_tensor(whole, piece.contiguous(), group=red.group)
    return whole[: local.numel()].view(local.shape)


def tree_reduce_scatter(local: torch.Tensor, dim: int, red: Reductions) -> torch.Tensor:
    """The tree sum over the group, each rank keeping its slice ``rank`` of ``dim`` (``n`` slices).

    Args:
        local: this rank's subtree; ``local.shape[dim]`` a multiple of the group size.
        dim: the dimension to scatter (e.g. the sequence under sequence parallelism).
        red: the units (one rank returns ``local``).

    Returns:
        ``local``'s shape with ``dim`` divided by the group size.
    """
    if red.group is None:
        return local
    if local.shape[dim] % red.size:
        raise ValueError(
            f"dimension {dim} ({local.shape[dim]}) does not split over {red.size} ranks"
        )
    slices = torch.stack(local.chunk(red.size, dim))
    shape = slices.shape[1:]
    if red.size == 2:  # one level: r0 + r1 (module docstring)
        out = torch.empty(shape.numel(), dtype=slices.dtype, device=slices.device)
        dist.reduce_scatter_tensor(out, slices.view(-1), group=red.group)
        return out.view(shape)
    return _halve(slices.reshape(red.size, -1), red).view(shape)


def sequence_all_gather(local: torch.Tensor, dim: int, red: Reductions) -> torch.Tensor:
    """Every rank's slice of ``dim`` joined in rank order (a copy: no arithmetic)."""
    if red.group is None:
        return local
    local = local.contiguous()
    whole = torch.empty(
        (red.size * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device
    )
    dist.all_gather_into_tensor(whole, local, group=red.group)
    return torch.cat(whole.view(red.size, *local.shape).unbind(0), dim=dim)


def _add_in_place(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.add_(b)  # the bits of a + b, into a fresh partial's memory


def folded_tree(
    leaf: Callable[[int, int | None], Any],
    count: int,
    add: Callable[[Any, Any], Any] = _add_in_place,
) -> Any:
    """The folded tree of ``count`` sequence chunks: leaf ``j`` holds chunks ``j`` and ``count - 1 - j``.

    The ``count / 2`` leaves are added as the balanced binary tree of
    :func:`tree_sum`, built as they come (a binary counter), so at most
    ``log2(count)`` partial results are alive at once.

    Args:
        leaf: ``leaf(j, mirror)`` is the sum of local chunks ``j`` and ``mirror``
            (a fresh tensor, or what ``add`` takes), computed by the same calls on
            every layout.
        count: the local chunks, an even number whose half is a power of two, or 1
            (the whole sequence: ``leaf(0, None)``).
        add: the addition of two nodes; the default adds in place into the first
            (every node is a fresh result).
    """
    if count == 1:
        return leaf(0, None)
    if count < 2 or not _power_of_two(count // 2) or count % 2:
        raise ValueError(f"a folded tree needs 2 * (a power of two) chunks, got {count}")
    stack: list[tuple[int, Any]] = []
    for j in range(count // 2):
        node, level = leaf(j, count - 1 - j), 0
        while stack and stack[-1][0] == level:
            node, level = add(stack.pop()[1], node), level + 1
        stack.append((level, node))
    return stack[0][1]


def folded_token_sum(
    leaf: Callable[[int, int | None], torch.Tensor],
    red: Reductions,
    count: int | None = None,
    *,
    complete: bool = True,
) -> torch.Tensor:
    """A sum over the tokens of this rank's sequence and its context-parallel group's (module docstring).

    Args:
        leaf: ``leaf(j, mirror)``: the sum over local sequence chunks ``j`` and
            ``mirror`` of ``count`` (each chunk ``[b, s / count]`` tokens; the same
            calls on every layout), a fresh tensor.
        red: the units (their context-parallel group completes the tree).
        count: the local chunks (default ``red.token_chunks``; weight gradients
            ``red.weight_chunks``).
        complete: complete the tree over the context-parallel group; False returns this
            rank's subtree, which the caller completes later with :func:`tree_all_reduce`
            over ``red.cp`` (:mod:`epochal.parallel.canonical_deferred`: the same bits).

    Returns:
        The whole sum, the same bits on every rank of the context-parallel group.
    """
    local = folded_tree(leaf, count or red.token_chunks)
    return tree_all_reduce(local, red.cp) if red.cp is not None and complete else local


def sequence_chunks(
    values: torch.Tensor, red: Reductions, *, sharded: bool = False, weights: bool = False
) -> int:
    """The folded chunks dimension 1 of ``values`` holds.

    ``token_chunks`` (``weight_chunks`` for ``weights``), or ``1 / n`` of them when
    ``sharded`` over the tensor-parallel group.

    Raises:
        ValueError: the sequence does not split into them.
    """
    total = red.weight_chunks if weights else red.token_chunks
    chunks = total // (red.size if sharded else 1)
    if chunks < 1 or values.shape[1] % chunks:
        raise ValueError(
            f"a sequence of {values.shape[1]} tokens does not split into {max(chunks, 1)} "
            f"chunks (2 * parallel.invariant_degree={2 * red.degree} or 2 * "
            f"parallel.invariant_context_degree={2 * red.context_degree}, over the context- "
            "and sequence-parallel ranks)"
        )
    return chunks


def token_chunk_sum(
    values: torch.Tensor, red: Reductions, *, sharded: bool, complete: bool = True
) -> torch.Tensor:
    """The sum over every dimension but the last, in the folded sequence chunks of dimension 1.

    The weight gradient of a norm or a bias is a sum over tokens. Each sequence
    chunk of ``values`` ``[b, s, C]`` is summed over its ``[b, s / chunks]`` tokens
    by the same call on every layout, and the chunks added as the folded tree
    (:func:`folded_token_sum`); under sequence parallelism (``sharded``) the
    chunks' sums are gathered over the group first (``C`` values per chunk).

    Args:
        values: ``[b, s_local, C]`` (2-D: one sequence).
        red: the units.
        sharded: the sequence is split over the tensor-parallel group.
        complete: complete the tree over the context-parallel group (:func:`folded_token_sum`).

    Returns:
        ``[C]``.
    """
    if values.dim() == 2:
        values = values.unsqueeze(0)
    chunks = sequence_chunks(values, red, sharded=sharded)
    parts = torch.stack(
        [
            piece.contiguous().sum(dim=tuple(range(piece.dim() - 1)))
            for piece in values.chunk(chunks, 1)
        ]
    )
    if sharded and red.group is not None:
        parts = sequence_all_gather(parts, 0, red)
    return folded_token_sum(lambda j, m: parts[j] + parts[m], red, complete=complete)
