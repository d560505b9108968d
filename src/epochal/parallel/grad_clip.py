"""Global gradient-norm clipping that is correct for any mix of DTensor and plain parameters.

``torch.nn.utils.clip_grad_norm_`` stacks per-tensor norms, which fails when some
gradients are DTensors (tensor-parallel or FSDP-sharded) and others plain
tensors, and it knows nothing of pipeline stages. Here the squared L2 norm is
accumulated from *local* shards and reduced exactly once over each dimension
along which a gradient is split:

- a DTensor gradient contributes ``sum(local ** 2)`` summed over the mesh
  dimensions where it is ``Shard`` or ``Partial`` (not where it is ``Replicate``,
  which would count it several times);
- a plain gradient is replicated over its stage's ranks and is counted once;
- stages add their sums over the pipeline group. The second copy of a tied
  embedding (the last stage's ``output.weight``) is left out of the norm (but
  still clipped), as Megatron does, so the norm equals the single-process one.

The result is Megatron's/PyTorch's: ``total = sqrt(sum of squares)`` (float32),
``coef = min(1, max_norm / (total + 1e-6))``, every gradient multiplied by
``coef``; nothing is scaled if the norm is not finite (the trainer then skips
the step).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

__all__ = ["clip_grad_norm_parallel", "total_grad_norm"]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def total_grad_norm(
    params: Iterable[torch.Tensor],
    *,
    pp_group: dist.ProcessGroup | None = None,
    exclude: Sequence[torch.Tensor] = (),
    sharded: tuple[Sequence[torch.Tensor], dist.ProcessGroup] | None = None,
) -> torch.Tensor:
    """Global L2 norm of the gradients of ``params`` over every rank.

    Args:
        params: this rank's parameters (each once); those without a gradient are skipped.
        pp_group: the pipeline group to sum the stages' contributions over (None: one stage).
        exclude: parameters whose gradients are not counted (duplicated copies).
        sharded: ``(params, group)``: plain parameters of ``params`` that differ over
            ``group`` (expert weights over the expert-parallel ranks): their squares
            are summed over ``group``.

    Returns:
        float32 scalar tensor, the same on every rank.
    """
    skip = {id(p) for p in exclude}
    split = torch.zeros((), dtype=torch.float32)
    split_ids = {id(p) for p in sharded[0]} if sharded is not None else set()
    plain = torch.zeros((), dtype=torch.float32)
    buckets: dict[tuple[int, tuple[int, ...]], tuple[object, torch.Tensor]] = {}
    device = None
    for p in params:
        g = p.grad
        if g is None or id(p) in skip:
            continue
        local = _local(g)
        device = local.device
        sq = local.detach().float().pow(2).sum()
        if id(p) in split_ids:
            split = split.to(sq.device) + sq
            continue
        if isinstance(g, DTensor):
            dims = tuple(i for i, pl in enumerate(g.placements) if not pl.is_replicate())
            if dims:
                key = (id(g.device_mesh), dims)
                mesh, acc = buckets.get(
                    key, (g.device_mesh, torch.zeros((), dtype=torch.float32, device=device))
                )
                buckets[key] = (mesh, acc + sq)
                continue
        plain = plain.to(sq.device) + sq
    if device is not None:
        plain = plain.to(device)
    total = plain
    if sharded is not None:
        split = split.to(plain.device)
        dist.all_reduce(split, group=sharded[1])
        total = total + split
    for (_, dims), (mesh, acc) in buckets.items():
        for d in dims:
            dist.all_reduce(acc, group=mesh.get_group(d))
        total = total + acc
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


@torch.no_grad()
def clip_grad_norm_parallel(
    params: Sequence[torch.Tensor],
    max_norm: float,
    *,
    pp_group: dist.ProcessGroup | None = None,
    exclude_from_norm: Sequence[torch.Tensor] = (),
    sharded: tuple[Sequence[torch.Tensor], dist.ProcessGroup] | None = None,
) -> torch.Tensor:
    """Clip gradients to a global L2 norm of ``max_norm`` (0 = only measure); return the norm.

    Args:
        params: this rank's parameters (all model parts, each once).
        max_norm: the clipping threshold (Megatron's ``clip_grad``).
        pp_group: the pipeline process group (None without pipeline parallelism).
        exclude_from_norm: duplicated parameters (tied copies) not counted in the norm.
        sharded: see :func:`total_grad_norm`.

    Returns:
        The total norm before clipping (float32 scalar, same on every rank);
        ``inf``/``nan`` if a gradient is not finite (then nothing is scaled).
    """
    total = total_grad_norm(params, pp_group=pp_group, exclude=exclude_from_norm, sharded=sharded)
    if max_norm > 0 and torch.isfinite(total):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        grads = [_local(p.grad) for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef.to(grads[0].device))
    return total
