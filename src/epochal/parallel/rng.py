"""Dropout randomness under tensor and pipeline parallelism (Megatron's RNG tracker, without its state).

Megatron-LM keeps two random streams on every rank:

- the *default* stream, identical on the tensor-parallel ranks of a group, for dropout
  on activations that every rank holds in full (the residual stream and the embedding
  output without sequence parallelism), so that those replicas stay identical;
- a *model-parallel* stream (its ``CudaRNGStatesTracker``), different on each
  tensor-parallel rank, for dropout on activations each rank holds its own part of:
  the attention probabilities of its heads and, with sequence parallelism, everything
  inside a transformer block and the embedding output (sequence slices). Without it,
  rank 1's heads (or tokens) would get exactly rank 0's masks.

Pipeline stages offset the default seed by ``100 * stage`` (:func:`pipeline_stage_seed`),
as Megatron does, so that stages holding different layers do not replay one another's
masks.

:func:`fork_rng_per_tp_rank` gives a module the model-parallel stream without
keeping any tracker state. Its forward is wrapped in hooks that

1. draw one 63-bit number from the default CPU generator (the same number on every
   tensor-parallel rank, so the default stream advances identically everywhere);
2. reseed the default generators (CPU, and the module's CUDA device) with a hash of
   ``(that number, tensor-parallel rank)`` and run the module;
3. restore the generators to their state after step 1 (also when the forward raises).

Activation recompute (``torch.utils.checkpoint`` restores the default generators at
the entry of the recomputed region) replays the same draw and therefore the same
masks, which a stateful tracker needs extra bookkeeping for.
:func:`apply_dropout_rng_regions` wraps the right modules of a tensor-parallel model
and does nothing for a model without dropout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from epochal.data.epochs.permutation import derive_seed

__all__ = ["apply_dropout_rng_regions", "fork_rng_per_tp_rank", "pipeline_stage_seed"]

_PIPELINE_SEED_STRIDE = 100  # Megatron: seed + 100 * pipeline rank


def pipeline_stage_seed(seed: int, pipeline_rank: int) -> int:
    """The default-stream seed of a pipeline stage (Megatron's ``seed + 100 * pp_rank``)."""
    return seed + _PIPELINE_SEED_STRIDE * pipeline_rank


def _device_of(args: tuple[Any, ...], module: nn.Module) -> torch.device:
    """The device the forward runs on: its first tensor input's, else the first parameter's."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


def fork_rng_per_tp_rank(module: nn.Module, tp_rank: int) -> None:
    """Run ``module``'s forward on a random stream of its own per tensor-parallel rank.

    See the module docstring for the three steps. Installs a forward pre-hook and an
    always-called forward hook; parameter names and the state dict are unchanged.

    Args:
        module: a module whose dropout acts on this rank's shard of the activations.
        tp_rank: this rank's tensor-parallel coordinate.
    """
    saved: list[tuple[torch.device, torch.Tensor, torch.Tensor | None]] = []

    def enter(mod: nn.Module, args: tuple[Any, ...]) -> None:
        device = _device_of(args, mod)
        draw = int(torch.empty((), dtype=torch.int64).random_())  # advances the default stream
        cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        saved.append((device, torch.get_rng_state(), cuda_state))
        seed = derive_seed(draw, tp_rank) >> 1  # < 2**63: valid for every generator
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            torch.cuda.default_generators[index].manual_seed(seed)

    def leave(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not saved:  # enter() raised before saving
            return
        device, cpu_state, cuda_state = saved.pop()
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)


def apply_dropout_rng_regions(model: nn.Module, tp_rank: int, *, sequence_parallel: bool) -> int:
    """Give the tensor-parallel regions of a GPT model (or stage) per-rank dropout streams.

    Without sequence parallelism only ``attention`` (its heads are sharded) forks;
    the residual-stream and embedding dropout stay on the default stream, identical
    on every rank. With sequence parallelism whole blocks and ``embedding_dropout``
    fork (their activations are sequence slices). Modules without dropout are left
    alone.

    Args:
        model: a :class:`~epochal.model.GPTModel` or pipeline stage, after
            :func:`~epochal.parallel.tensor_parallel.apply_tensor_parallel`.
        tp_rank: this rank's tensor-parallel coordinate.
        sequence_parallel: whether sequence parallelism is on.

    Returns:
        The number of modules that were given their own stream.
    """
    config = model.config
    hidden, attention = config.hidden_dropout > 0, config.attention_dropout > 0
    regions: list[nn.Module] = []
    for block in model.layers.values():
        if sequence_parallel and (hidden or attention):
            regions.append(block)
        elif attention:
            regions.append(block.attention)
            cross = getattr(block, "cross_attention", None)  # T5 decoder blocks
            if cross is not None:
                regions.append(cross)
    if sequence_parallel and hidden and getattr(model, "tok_embeddings", None) is not None:
        regions.append(model.embedding_dropout)
    for module in regions:
        fork_rng_per_tp_rank(module, tp_rank)
    return len(regions)
