"""Per-micro-batch values of all data-parallel ranks, in the global micro-batch order.

Micro-batch ``i`` of data-parallel rank ``r`` is global micro-batch ``k = i * dp +
r`` (the samplers give rank ``r`` the ``r``-th micro-batch of every block of ``dp``
consecutive ones). A value summed over the global batch in the order ``k = 0,
1, ...`` is the same number whatever ``dp`` is, and equals what one process
computes; averaging each rank's mean and then the ranks' means is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["gather_in_order", "gather_objects_in_order", "sequential_sum"]


def _interleave(per_rank: Sequence[Sequence[Any]]) -> list[Any]:
    """``per_rank[r][i]`` listed by ``k = i * dp + r``."""
    n = len(per_rank[0]) if per_rank else 0
    if any(len(values) != n for values in per_rank):
        raise ValueError(
            f"data-parallel ranks ran different numbers of micro-batches: {[len(v) for v in per_rank]}"
        )
    return [values[i] for i in range(n) for values in per_rank]


def gather_in_order(values: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Every data-parallel rank's 1-D ``values`` (one per local micro-batch), in global order.

    Args:
        values: ``[n]`` on this rank (the same ``n`` and dtype on every rank).
        group: the data-parallel group (None: ``values`` itself).

    Returns:
        ``[n * dp]`` on ``values``' device, the same on every rank of ``group``.
    """
    if group is None or dist.get_world_size(group) == 1:
        return values
    staged = values.is_cuda and dist.get_backend(group) == "gloo"
    src = values.detach().cpu() if staged else values.detach().contiguous()
    parts = [torch.empty_like(src) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, src, group=group)
    return torch.stack(parts).t().reshape(-1).to(values.device)


def gather_objects_in_order(values: Sequence[Any], group: dist.ProcessGroup | None) -> list[Any]:
    """Like :func:`gather_in_order` for a list of picklable objects (e.g. logged-value dicts)."""
    if group is None or dist.get_world_size(group) == 1:
        return list(values)
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, list(values), group=group)
    return _interleave(out)


def sequential_sum(values: torch.Tensor) -> torch.Tensor:
    """``((0 + v[0]) + v[1]) + ...`` as 0-d tensors of ``values``' dtype, the order one process adds in."""
    total = torch.zeros((), dtype=values.dtype, device=values.device)
    for v in values:
        total += v
    return total
