"""``avg_losses_across_data_parallel_group`` and ``gather_across_data_parallel_groups`` (Accelerate's names).

The trainer registers its data-parallel group here (:func:`set_data_parallel_group`);
a loss function may call the helper to log values already averaged over the
data-parallel ranks (the trainer averages logged values over them anyway, so
calling it or not logs the same numbers). :func:`gather_across_data_parallel_groups`
collects a tensor (e.g. evaluation logits) from every data-parallel rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = [
    "avg_losses_across_data_parallel_group",
    "data_parallel_group",
    "gather_across_data_parallel_groups",
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


def gather_across_data_parallel_groups(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` of every data-parallel rank along dim 0, in rank order.

    A collective over the registered data-parallel group (every rank of it must
    call it); without data parallelism, ``tensor`` itself. The first dimension may
    differ between ranks; the others and the dtype must agree.

    Args:
        tensor: ``[n_r, ...]`` on this rank (e.g. one evaluation micro-batch's logits
            ``[b, s, V]``, see ``Trainer.evaluate_logits``).

    Returns:
        ``[sum_r n_r, ...]``, the same on every rank of the group, on ``tensor``'s device.

    Raises:
        ValueError: a 0-d tensor, or ranks whose trailing shapes differ.
    """
    if tensor.dim() == 0:
        raise ValueError("gather_across_data_parallel_groups needs a tensor with a batch dimension")
    group = _GROUP[0]
    if group is None or dist.get_world_size(group) == 1:
        return tensor
    world = dist.get_world_size(group)
    shape = torch.tensor(
        list(tensor.shape), dtype=torch.int64, device=tensor.device
    )  # NCCL: on the GPU
    shapes = [torch.empty_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape, group=group)
    if any(s.numel() != shape.numel() or not torch.equal(s[1:], shape[1:]) for s in shapes):
        raise ValueError(
            "gather_across_data_parallel_groups: the ranks' shapes differ beyond dim 0: "
            f"{[tuple(s.tolist()) for s in shapes]}"
        )
    longest = int(max(int(s[0]) for s in shapes))
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[: int(s[0])] for p, s in zip(parts, shapes)])
