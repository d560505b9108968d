"""``avg_losses_across_data_parallel_group``: Megatron's / Accelerate's helper for loss functions.

The trainer registers its data-parallel group here (:func:`set_data_parallel_group`);
a loss function may call the helper to log values already averaged over the
data-parallel ranks (the trainer averages logged values over them anyway, so
calling it or not logs the same numbers).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = [
    "avg_losses_across_data_parallel_group",
    "data_parallel_group",
    "set_data_parallel_group",
]

_GROUP: list[dist.ProcessGroup | None] = [None]


def set_data_parallel_group(group: dist.ProcessGroup | None) -> None:
    """Register the data-parallel group of this process (None: no data parallelism)."""
    _GROUP[0] = group


def data_parallel_group() -> dist.ProcessGroup | None:
    """The registered data-parallel group (None without data parallelism)."""
    return _GROUP[0]


def avg_losses_across_data_parallel_group(losses: Sequence[torch.Tensor]) -> torch.Tensor:
    """Average each of ``losses`` over the data-parallel ranks.

    Args:
        losses: one-element tensors (e.g. the micro-batch's loss), the same count on every rank.

    Returns:
        A detached 1-D tensor ``[len(losses)]`` of the averages (the values
        themselves without data parallelism).
    """
    averaged = torch.cat([loss.clone().detach().float().reshape(1) for loss in losses])
    group = _GROUP[0]
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(averaged, group=group)
        averaged = averaged / dist.get_world_size(group)
    return averaged
