"""Data parallelism: replicated (DDP-like) or the distributed optimizer (FSDP2), chosen by ``dp_sharding``.

All three modes are PyTorch's FSDP2 machinery on the data-parallel mesh
(``mesh["dp"]``), so they compose with tensor-parallel DTensor parameters and
with pipeline stages:

- ``none``: ``replicate`` (FSDP2's replicated mode): every rank holds the full
  parameters and optimizer state; gradients are all-reduced (averaged) once per
  step. This is DDP.
- ``optimizer``: ``fully_shard(reshard_after_forward=False)`` per transformer
  block and on the root: parameters, gradients and optimizer state are stored
  sharded (each rank owns ``1/dp`` of every tensor, dim 0); parameters are
  all-gathered before the forward and kept until the backward; gradients are
  reduce-scattered. This is ZeRO-2 / Megatron's distributed optimizer (which
  all-gathers updated parameters once per step; here the gather happens at the
  next forward).
- ``full``: ``fully_shard(reshard_after_forward=True)`` per block (root: False):
  parameters are freed after each block's forward and gathered again for its
  backward (ZeRO-3 / FSDP).

Gradients are averaged over the data-parallel ranks (each rank's loss is the
mean of its micro-batches, so the result equals the single-process mean over
the global batch). The optimizer then sees DTensor parameters and gradients
sharded over ``dp`` (and ``tp``), and ``torch.optim.AdamW`` updates the local
shards; its state dict is sharded the same way and DCP reshards it on load.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from epochal.model.config import ConfigError
from epochal.parallel.expert_parallel import expert_parameters

__all__ = ["apply_data_parallel", "set_gradient_sync"]


def _replicate(module: nn.Module, mesh: DeviceMesh, ignored: set[nn.Parameter] | None) -> nn.Module:
    from torch.distributed._composable.replicate_with_fsdp import replicate

    return replicate(module, mesh=mesh, ignored_params=ignored)


def apply_data_parallel(
    part: nn.Module,
    dp_mesh: DeviceMesh,
    sharding: str,
    *,
    unit_keys: Iterable[str] | None = None,
) -> nn.Module:
    """Apply data parallelism to one model part in place.

    Args:
        part: a model part (the model or a pipeline chunk), after tensor
            parallelism, recompute and compile.
        dp_mesh: the 1-D data-parallel mesh (size 1 = nothing to do).
        sharding: ``none``, ``optimizer`` or ``full`` (see the module docstring).
        unit_keys: the keys of ``part.layers`` to shard as separate units (one
            per recompute group; default: every block).

    Returns:
        ``part``.

    Raises:
        ConfigError: unknown ``sharding``.
    """
    if dp_mesh.size() == 1:
        return part
    # expert-parallel experts differ over the data-parallel ranks: expert_parallel.py reduces them
    ignored = set(expert_parameters(part)) or None
    if sharding == "none":
        return _replicate(part, dp_mesh, ignored)
    if sharding not in ("optimizer", "full"):
        raise ConfigError(
            "parallel.dp_sharding", f"must be none, optimizer or full, got {sharding!r}"
        )
    reshard = sharding == "full"
    keys = list(part.layers.keys()) if unit_keys is None else list(unit_keys)
    for key in keys:
        fully_shard(
            part.layers[key], mesh=dp_mesh, reshard_after_forward=reshard, ignored_params=ignored
        )
    fully_shard(part, mesh=dp_mesh, reshard_after_forward=False, ignored_params=ignored)
    return part


def set_gradient_sync(parts: Iterable[nn.Module], enabled: bool) -> None:
    """Turn the data-parallel gradient reduction on or off (off for all but the last micro-batch)."""
    for part in parts:
        if isinstance(part, FSDPModule):
            part.set_requires_gradient_sync(enabled)
