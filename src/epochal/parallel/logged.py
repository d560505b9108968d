"""The values a train step's loss function logs: checked, averaged over micro-batches and ranks.

A loss function returns ``(loss, {"name": value, ...})`` or ``(loss_sum, count, {...})``
(Megatron's contract, :func:`~epochal.parallel.step_plan.split_loss_output`).
Per step, each name's values are averaged over the micro-batches (in micro-batch
order), sent from the last pipeline stage to every pipeline rank, and averaged
over the data-parallel ranks, so every rank logs the same numbers. With
``ordered=True`` (layout-invariant training) the micro-batches' values of every
data-parallel rank are gathered first and averaged once in the global
micro-batch order (:mod:`epochal.parallel.global_order`), which is what one
process computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from epochal.parallel.global_order import gather_objects_in_order

__all__ = ["ordered_logged", "reduce_logged"]


def _as_float(value: Any) -> float:
    return float(value.detach().float().item()) if isinstance(value, torch.Tensor) else float(value)


def _mean_over_microbatches(per_mb: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for logged in per_mb:
        for name, value in logged.items():
            sums[name] = sums.get(name, 0.0) + _as_float(value)
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


def ordered_logged(
    per_mb: Sequence[Mapping[str, Any]],
    *,
    pp_group: dist.ProcessGroup | None = None,
    pp_src: int = 0,
    dp_group: dist.ProcessGroup | None = None,
) -> list[dict[str, float]]:
    """Every micro-batch's logged values (as floats) of the global batch, in global order, on every rank.

    Args: as :func:`reduce_logged`.
    """
    values: list[dict[str, float]] = [
        {name: _as_float(v) for name, v in logged.items()} for logged in per_mb
    ]
    if pp_group is not None:
        box: list[Any] = [values]
        dist.broadcast_object_list(box, group=pp_group, group_src=pp_src)
        values = box[0]
    return gather_objects_in_order(values, dp_group)


def reduce_logged(
    per_mb: Sequence[Mapping[str, Any]],
    *,
    pp_group: dist.ProcessGroup | None = None,
    pp_src: int = 0,
    dp_group: dist.ProcessGroup | None = None,
    device: torch.device | None = None,
    ordered: bool = False,
) -> dict[str, float]:
    """One step's logged values: mean over micro-batches, from the last stage, mean over DP ranks.

    Args:
        per_mb: the logged dicts of this rank's micro-batches (empty on ranks
            without the last pipeline stage).
        pp_group: the pipeline group (None without pipeline parallelism).
        pp_src: the group rank holding the last stage.
        dp_group: the data-parallel group (None without data parallelism).
        device: where the reduction's tensor lives (the backend's device).
        ordered: average every micro-batch of the global batch at once, in global
            order (:func:`ordered_logged`), instead of averaging the ranks' means.

    Returns:
        ``{name: float}``, the same on every rank (names sorted).
    """
    if ordered:
        merged = _mean_over_microbatches(
            ordered_logged(per_mb, pp_group=pp_group, pp_src=pp_src, dp_group=dp_group)
        )
        return {n: merged[n] for n in sorted(merged)}
    values = _mean_over_microbatches(per_mb)
    if pp_group is not None:
        box: list[Any] = [values]
        dist.broadcast_object_list(box, group=pp_group, group_src=pp_src)
        values = box[0]
    names = sorted(values)
    if dp_group is not None and names:
        t = torch.tensor([values[n] for n in names], dtype=torch.float64, device=device)
        dist.all_reduce(t, group=dp_group)
        t /= dist.get_world_size(dp_group)
        values = dict(zip(names, t.tolist()))
    return {n: values[n] for n in names}
