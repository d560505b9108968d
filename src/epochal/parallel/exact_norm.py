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
2. every rank's row sums are gathered and added with :func:`math.fsum`, which
   rounds the exact sum once, so the order (which rank, which shard) is
   irrelevant;
3. ``norm = float32(sqrt(total))``.

Replicated gradients are counted once (by the rank at coordinate 0 of each
dimension they are replicated over) and the second copy of a tied embedding is
left out, as in :mod:`epochal.parallel.grad_clip`. Clipping then scales every
gradient by ``min(1, max_norm / (norm + 1e-6))`` computed in float32, as PyTorch does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["clip_grad_norm_exact", "exact_grad_norm", "row_square_sums"]


def row_square_sums(grad: torch.Tensor) -> torch.Tensor:
    """float64 ``[rows]``: the sum of squares of each dim-0 row of ``grad`` (a 0-d tensor is one row)."""
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


def _gather_sums(local: torch.Tensor, group: dist.ProcessGroup | None) -> list[float]:
    values = local.cpu()
    if group is None or dist.get_world_size(group) == 1:
        return values.tolist()
    sizes: list[int] = [0] * dist.get_world_size(group)
    dist.all_gather_object(sizes, int(values.numel()), group=group)
    padded = torch.zeros(max(sizes), dtype=torch.float64)
    padded[: values.numel()] = values
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return [v for part, n in zip(parts, sizes) for v in part[:n].tolist()]


def exact_grad_norm(
    params: Iterable[torch.Tensor],
    *,
    group: dist.ProcessGroup | None = None,
    exclude: Sequence[torch.Tensor] = (),
    coords: Mapping[str, int] | None = None,
) -> torch.Tensor:
    """The global L2 norm of the gradients of ``params``, identical under every layout.

    Args:
        params: this rank's parameters (each once); those without a gradient are skipped.
        group: the ranks whose gradients make up the model (None: this process alone).
        exclude: parameters whose gradients are not counted (a tied copy).
        coords: this rank's coordinates on the mesh dimensions that hold replicas
            (e.g. ``{"dp": 1, "tp": 0}``; a pipeline stage holds its own
            parameters, so ``pp`` is not one of them); None: one process.

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
        if _counted(g, coords or {}):
            sums.append(row_square_sums(local))
    local_sums = torch.cat(sums) if sums else torch.zeros(0, dtype=torch.float64)
    values = _gather_sums(local_sums, group)
    if all(math.isfinite(v) for v in values):
        total = math.sqrt(math.fsum(values))
    else:
        total = math.nan if any(math.isnan(v) for v in values) else math.inf
    return torch.tensor(total, dtype=torch.float32, device=device)


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
