"""Activation recompute (activation checkpointing) with Megatron-LM's options.

``recompute_granularity``:

- ``none``: keep every activation.
- ``full``: recompute whole transformer layers in the backward, storing only
  their inputs. ``recompute_method`` picks which (per model chunk, as Megatron):

  * ``uniform``: every layer; consecutive groups of ``recompute_num_layers``
    layers are recomputed as one unit (one stored input per group);
  * ``block``: only the first ``recompute_num_layers`` layers of each chunk,
    each on its own; the others keep their activations.

- ``selective``: every layer keeps the outputs of its matmuls and of the
  attention kernel and recomputes the cheap pointwise ops (norms, activation
  functions, rotary, dropout, residual adds) — torchtitan's op-level selective
  checkpointing. Megatron's own "selective" recomputes the core attention
  (softmax and dropout) only; here, on the math attention path (used with
  attention dropout on CPU), the attention's batched matmuls are saved and its
  softmax/dropout recomputed, which is exactly Megatron's choice.

The attention kernel differs by device: CUDA uses
``aten._scaled_dot_product_flash_attention`` / ``_efficient_attention`` /
``_cudnn_attention``; the CPU uses ``aten._scaled_dot_product_flash_attention_for_cpu``
(and the decomposed math path with dropout). All are in the save list.

In canonical units (:mod:`epochal.parallel.canonical_plan`) the products are custom
autograd functions whose inner batched matmuls give ``D / n`` partial results each;
those are recomputed, not kept, so selective recompute there recomputes the products
too and keeps the attention's kernel outputs.

Dropout masks are the same in the recomputation (the RNG state is restored),
so losses and gradients equal those without recompute.

Parameter names do not change: wrappers hold the block as
``_checkpoint_wrapped_module``, which checkpoint state-dict helpers and
:func:`epochal.model.init.canonical_name` strip.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    ActivationWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from epochal.model.config import ConfigError

__all__ = ["SAVE_OPS", "apply_recompute", "recompute_part", "recompute_plan"]


def _ops(*names: str) -> set[Any]:
    found = set()
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(torch.ops.aten, packet, None)
        if op is not None and hasattr(op, overload or "default"):
            found.add(getattr(op, overload or "default"))
    return found


#: Ops whose outputs selective recompute keeps.
SAVE_OPS: set[Any] = _ops(
    "mm.default",
    "addmm.default",
    "bmm.default",
    "baddbmm.default",
    "linear.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_cudnn_attention.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_mm.default",
) | {
    op
    for op in (
        getattr(getattr(torch.ops, "_c10d_functional", None), "reduce_scatter_tensor", None),
        getattr(getattr(torch.ops, "_c10d_functional", None), "all_reduce", None),
    )
    if op is not None
    for op in [op.default]
}


def _selective_policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    # Inside a custom autograd function (its forward runs without grad: the canonical
    # units' chunked products) the partial results are not kept: the function saves
    # what its backward needs itself, and a stack of partials would outweigh the
    # activations it stands for.
    if func in SAVE_OPS and torch.is_grad_enabled():
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)


def recompute_plan(
    num_layers: int, granularity: str, method: str, recompute_num_layers: int
) -> list[list[int]]:
    """Which local layers (0-based positions in a chunk) are recomputed, grouped per unit.

    Returns:
        A list of groups; each group is recomputed as one unit. Positions not in
        any group keep their activations. ``selective`` returns one group per layer
        (each with the selective policy).

    Raises:
        ConfigError: an unknown granularity or method.
    """
    if granularity == "none" or num_layers == 0:
        return []
    if granularity == "selective":
        return [[i] for i in range(num_layers)]
    if granularity != "full":
        raise ConfigError(
            "parallel.recompute_granularity",
            f"must be none, full or selective, got {granularity!r}",
        )
    n = recompute_num_layers
    if method == "uniform":
        return [list(range(s, min(s + n, num_layers))) for s in range(0, num_layers, n)]
    if method == "block":
        return [[i] for i in range(min(n, num_layers))]
    raise ConfigError("parallel.recompute_method", f"must be uniform or block, got {method!r}")


class _RecomputeGroup(ActivationWrapper):
    """Runs a group of blocks under one checkpoint; registered in place of the group's first block.

    Like PyTorch's checkpoint wrapper it holds the block as
    ``_checkpoint_wrapped_module`` and strips that name from parameter names and
    state dicts, so names stay those of the plain model.
    """

    def __init__(self, head: nn.Module, members: list[nn.Module]) -> None:
        super().__init__(head)
        self._members = members  # plain list: not registered (their own slots own them)

    def _run(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        x = self._checkpoint_wrapped_module(x, *rest)
        for block in self._members:
            x = block(x, *rest)
        return x

    def forward(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        return checkpoint(self._run, x, *rest, use_reentrant=False, preserve_rng_state=True)


class _GroupMember(ActivationWrapper):
    """Placeholder slot for a block that its group's head runs: the identity in the model's loop."""

    def forward(self, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        return x


def apply_recompute(
    layers: nn.ModuleDict,
    granularity: str,
    *,
    method: str = "uniform",
    num_layers: int = 1,
    segments: list[list[str]] | None = None,
) -> list[str]:
    """Wrap the blocks of one model chunk for activation recompute, in place.

    Args:
        layers: the chunk's ``ModuleDict`` of blocks (keys are global layer ids).
        granularity: ``none``, ``full`` or ``selective``.
        method: ``uniform`` or ``block`` (for ``full``).
        num_layers: Megatron's ``recompute_num_layers``.
        segments: runs of keys that take the same inputs (a T5's encoder blocks,
            then its decoder blocks: ``T5Model.block_segments()``); the plan applies
            to each run on its own, so a group never spans two. ``None`` = all keys.

    Returns:
        The keys whose modules can be sharded by data parallelism as separate
        units: every key except the members of multi-layer recompute groups
        (a group head runs its members' blocks itself, so those parameters
        must stay gathered for the whole forward and backward: they are left
        to the enclosing unit).
    """
    keys = list(layers.keys())
    groups: list[list[int]] = []
    for segment in segments if segments is not None else [keys]:
        positions = [keys.index(k) for k in segment if k in layers]
        plan = recompute_plan(len(positions), granularity, method, num_layers)
        groups += [[positions[i] for i in group] for group in plan]
    in_multi = {i for g in groups if len(g) > 1 for i in g}
    for group in groups:
        head_key = keys[group[0]]
        if granularity == "selective":
            layers[head_key] = checkpoint_wrapper(
                layers[head_key], context_fn=_selective_context, preserve_rng_state=True
            )
        elif len(group) == 1:
            layers[head_key] = checkpoint_wrapper(layers[head_key], preserve_rng_state=True)
        else:
            members = [layers[keys[i]] for i in group[1:]]
            layers[head_key] = _RecomputeGroup(layers[head_key], members)
            for i in group[1:]:
                layers[keys[i]] = _GroupMember(layers[keys[i]])
    return [k for i, k in enumerate(keys) if i not in in_multi]


def recompute_part(part: nn.Module, config: Any) -> list[str]:
    """:func:`apply_recompute` on a model part's blocks per a ``ParallelConfig``'s ``recompute_*``.

    A part with ``block_segments()`` (a T5) gets the plan per segment. Returns the
    keys :func:`apply_recompute` returns.
    """
    return apply_recompute(
        part.layers,
        config.recompute_granularity,
        method=config.recompute_method,
        num_layers=config.recompute_num_layers,
        segments=part.block_segments() if hasattr(part, "block_segments") else None,
    )


def unwrap_block(module: nn.Module) -> nn.Module:
    """The transformer block inside a recompute wrapper (or the module itself)."""
    while hasattr(module, "_checkpoint_wrapped_module"):
        module = module._checkpoint_wrapped_module
    return module


def blocks(layers: Iterable[nn.Module]) -> list[nn.Module]:
    """The transformer blocks of ``layers`` with recompute wrappers removed."""
    return [unwrap_block(m) for m in layers]
