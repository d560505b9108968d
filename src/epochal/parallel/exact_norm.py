"""The global gradient norm as one number under any layout: row sums of squares, added exactly.

Clipping multiplies every gradient by ``max_norm / (norm + 1e-6)``, so the norm's
last bits reach the weights. A norm summed per shard and then over ranks
depends on the sharding. Here it is computed from pieces every layout has
whole:

1. each parameter's gradient (its tensor-parallel local tensor) is seen as rows
   along dim 0 (FSDP2 shards whole rows); each row's sum of squares is computed
   in float64 (a float32 squared is exact in float64) by the same kernel
   whatever the number of rows (a lone row is padded with a zero row, so the
   reduction never splits one row over threads);
2. all rows of all ranks are added exactly (:func:`exact_sum`: integer mantissas
   summed per binary exponent, one integer all-reduce) and rounded once, so the
   order (which rank, which shard) is irrelevant;
3. ``norm = float32(sqrt(total))``.

Replicated gradients are counted once (by the rank at coordinate 0 of each
dimension they are replicated over) and the second copy of a tied embedding is
left out, as in :mod:`epochal.parallel.grad_clip`. Clipping then scales every
gradient by ``min(1, max_norm / (norm + 1e-6))`` computed in float32, as PyTorch does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["clip_grad_norm_exact", "exact_grad_norm", "exact_sum", "row_square_sums"]


def row_square_sums(grad: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """float64 ``[rows]``: the sum of squares of each dim-0 row of ``grad`` (a 0-d tensor is one row).

    ``width``: cut the last dimension into pieces of that many elements first, each
    piece a row (the canonical chunks of :mod:`epochal.parallel.canonical`, so that a
    tensor-parallel shard of the last dimension holds whole pieces).
    """
    if width is not None and grad.dim() and grad.shape[-1] % width == 0:
        rows = grad.detach().reshape(-1, width).double()
    else:
        rows = grad.detach().reshape(grad.shape[0] if grad.dim() else 1, -1).double()
    if rows.shape[0] == 0:
        return rows.new_zeros(0)
    squares = rows * rows
    if rows.shape[0] == 1:  # two outputs: the reduction runs per row, as for a full tensor
        return torch.cat([squares, torch.zeros_like(squares)]).sum(dim=1)[:1]
    return squares.sum(dim=1)


def _counted(grad: torch.Tensor, coords: Mapping[str, int]) -> bool:
    """Whether this rank's copy of ``grad`` counts: replicated copies count once.

    ``grad`` is replicated over a mesh dimension of ``coords`` where its placement
    is ``Replicate`` or which its mesh does not have (a plain tensor has none);
    only the rank at coordinate 0 there counts it.
    """
    names: tuple[str, ...] = ()
    placements: tuple[Any, ...] = ()
    if isinstance(grad, DTensor):
        names = tuple(grad.device_mesh.mesh_dim_names or ())
        placements = tuple(grad.placements)
    for dim, coord in coords.items():
        if coord == 0:
            continue
        if dim not in names or placements[names.index(dim)].is_replicate():
            return False
    return True


_BINS = 2100  # float64 binary exponents (frexp: -1073 .. 1024), offset by _OFFSET
_OFFSET = 1075
_HALF = 27  # a 53-bit mantissa as two halves: sums of 2**36 of them still fit in int64


def exact_sum(values: torch.Tensor, group: dist.ProcessGroup | None = None) -> float:
    """The exact sum of non-negative float64 ``values`` over every rank of ``group``, rounded once.

    Each value is split into its binary exponent and integer mantissa (two 27-bit
    halves); the halves are added as integers per exponent (exact in any order)
    and the bins of all ranks with one integer all-reduce; the total is then
    rebuilt as a Python integer and rounded to float64 once. So the result is the
    correctly rounded sum whatever the order, the sharding or the number of ranks.

    Args:
        values: float64 ``[n]``, each ``>= 0`` or not finite, on any device.
        group: the ranks to sum over (None: this process).

    Returns:
        The sum (``inf`` if a value is infinite, ``nan`` if one is nan).
    """
    x = values.detach().double().flatten().cpu()
    finite = torch.isfinite(x)
    bins = torch.zeros(2 * _BINS + 2, dtype=torch.int64)
    bins[-2] = int(torch.isinf(x).sum())
    bins[-1] = int(torch.isnan(x).sum())
    m, e = torch.frexp(x[finite])
    mantissa = torch.ldexp(m, torch.tensor(53.0, dtype=torch.float64)).to(torch.int64)  # exact
    index = (e.to(torch.int64) + _OFFSET) * 2
    bins.index_add_(0, index, mantissa >> _HALF)
    bins.index_add_(0, index + 1, mantissa & ((1 << _HALF) - 1))
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(bins, group=group)
    counts = bins.tolist()
    if counts[-1]:
        return math.nan
    if counts[-2]:
        return math.inf
    total = 0
    for b in range(_BINS):
        hi, lo = counts[2 * b], counts[2 * b + 1]
        if hi or lo:  # value * 2**(exponent - 53), kept as an integer over 2**(_OFFSET + 53)
            total += ((hi << _HALF) + lo) << b
    try:
        return float(Fraction(total, 1 << (_OFFSET + 53)))
    except OverflowError:  # beyond float64's range
        return math.inf


def exact_grad_norm(
    params: Iterable[torch.Tensor],
    *,
    group: dist.ProcessGroup | None = None,
    exclude: Sequence[torch.Tensor] = (),
    coords: Mapping[str, int] | None = None,
    param_coords: Mapping[int, Mapping[str, int]] | None = None,
    pieces: int = 1,
) -> torch.Tensor:
    """The global L2 norm of the gradients of ``params``, identical under every layout.

    Args:
        params: this rank's parameters (each once); those without a gradient are skipped.
        group: the ranks whose gradients make up the model (None: this process alone).
        exclude: parameters whose gradients are not counted (a tied copy).
        coords: this rank's coordinates on the mesh dimensions that hold replicas
            (e.g. ``{"dp": 1, "tp": 0}``; a pipeline stage holds its own
            parameters, so ``pp`` is not one of them); None: one process.
        param_coords: ``id(param) -> coords`` for parameters replicated over other
            ranks than ``coords`` says (expert weights: over the expert-data-parallel
            ranks only, :mod:`epochal.parallel.expert_parallel`).
        pieces: cut each gradient's (whole) last dimension into this many pieces, each
            a row (:func:`row_square_sums`): the canonical chunks, whole on every layout.

    Returns:
        float32 scalar tensor on the gradients' device, the same on every rank
        (``inf``/``nan`` if a gradient is not finite).
    """
    skip = {id(p) for p in exclude}
    sums: list[torch.Tensor] = []
    device = torch.device("cpu")
    for p in params:
        g = p.grad
        if g is None or id(p) in skip:
            continue
        local = g._local_tensor if isinstance(g, DTensor) else g
        device = local.device
        own = param_coords.get(id(p)) if param_coords else None
        if _counted(g, own if own is not None else coords or {}):
            full = g.shape[-1] if g.dim() else 0
            width = full // pieces if pieces > 1 and full and full % pieces == 0 else None
            sums.append(row_square_sums(local, width))
    local_sums = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)
    total = exact_sum(local_sums, group)
    return torch.tensor(math.sqrt(total), dtype=torch.float32, device=device)


@torch.no_grad()
def clip_grad_norm_exact(
    params: Sequence[torch.Tensor], max_norm: float, **kwargs: Any
) -> torch.Tensor:
    """Clip gradients to the global L2 norm ``max_norm`` (0 = only measure) with :func:`exact_grad_norm`.

    Args:
        params: this rank's parameters (each once).
        max_norm: the clipping threshold (``optimizer.clip_grad``).
        **kwargs: passed to :func:`exact_grad_norm`.

    Returns:
        The norm before clipping (float32 scalar; nothing is scaled when it is not finite).
    """
    total = exact_grad_norm(params, **kwargs)
    if max_norm > 0 and torch.isfinite(total):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        grads = [p.grad for p in params if p.grad is not None]
        local = [g._local_tensor if isinstance(g, DTensor) else g for g in grads]
        if local:
            torch._foreach_mul_(local, coef.to(local[0].device))
    return total
