"""Dropout keyed by the micro-batch, not by the rank: the same masks under any data-parallel layout.

A rank's running random stream depends on how many micro-batches it ran before
(on two data-parallel ranks, rank 1's first micro-batch would replay rank 0's
masks, and neither would draw what one process draws). With keyed dropout the
random state of a micro-batch is a pure function of ``(training.seed, the
optimizer step, its global micro-batch index)`` (micro-batch ``i`` of
data-parallel rank ``r`` is global micro-batch ``i * dp + r``, the samplers'
order), and the masks of a transformer block a pure function of that and the
block's layer number:

1. before a micro-batch's forward, :func:`seed_micro_batch` reseeds the default
   generators (CPU, and the device's CUDA generator) with
   :func:`micro_batch_seed`; what runs outside the blocks (embedding and head
   dropout) draws from this stream;
2. a forward pre-hook on every transformer block (:func:`install_keyed_dropout`)
   reseeds them with ``derive_seed(micro-batch seed, layer number)`` and a
   forward hook restores the state of step 1 afterwards, so every block starts
   from the micro-batch seed whatever ran before it: a pipeline stage that
   holds layers 2-3 draws exactly what one process draws there;
3. under pipeline parallelism the schedule runs the stages, so the engine passes
   the micro-batch seeds as the keyword :data:`DROPOUT_SEED_KWARG` (one per
   micro-batch, split by the schedule); a pre-hook on the stage module takes it
   out of the call and applies step 1.

The micro-batch seed is read back from the generator (``torch.initial_seed()``),
so activation recompute, which restores the generator state it saw at the
checkpoint's entry, replays the same masks even when the recomputation runs
after other micro-batches' forwards (1F1B schedules). The block hooks run before
any tensor-parallel stream fork (:mod:`epochal.parallel.rng`), which then forks
from the block's keyed stream.

The trainers keep the global streams as they were around a step
(:func:`preserved_rng`), so keyed dropout changes nothing else that draws from them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from epochal.data.epochs.permutation import derive_seed

__all__ = [
    "DROPOUT_SEED_KWARG",
    "has_dropout",
    "install_keyed_dropout",
    "micro_batch_seed",
    "preserved_rng",
    "seed_micro_batch",
    "step_seeds",
]

#: The keyword the engine passes to pipeline stages: int64 ``[n]``, one seed per micro-batch.
DROPOUT_SEED_KWARG = "_epochal_dropout_seed"
_DROPOUT_WORD = 0x64726F70  # "drop": keeps these seeds apart from the data's derived seeds


def micro_batch_seed(seed: int, step: int, index: int) -> int:
    """The random seed of global micro-batch ``index`` of optimizer step ``step``.

    Args:
        seed: ``training.seed``.
        step: the optimizer steps done before this one (``>= 0``).
        index: the global micro-batch index in the step (``>= 0``; ``i * dp + r``
            for micro-batch ``i`` of data-parallel rank ``r``).

    Returns:
        An integer in ``[0, 2**63)`` (valid for every PyTorch generator).
    """
    return derive_seed(seed, _DROPOUT_WORD, step, index) >> 1


def _device_index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def seed_micro_batch(seed: int, device: torch.device) -> None:
    """Reseed the default CPU generator (and ``device``'s CUDA generator) with ``seed``."""
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.default_generators[_device_index(device)].manual_seed(seed)


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Restore the default CPU generator (and ``device``'s CUDA one) on exit, also on errors."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def has_dropout(model: nn.Module) -> bool:
    """Whether ``model`` draws random numbers in training (a dropout module or attention dropout)."""
    config = getattr(model, "config", None)
    if getattr(config, "attention_dropout", 0.0) > 0 or getattr(config, "hidden_dropout", 0.0) > 0:
        return True
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def _unwrap(module: nn.Module) -> nn.Module:
    while hasattr(module, "_checkpoint_wrapped_module"):
        module = module._checkpoint_wrapped_module
    return module


def _key_block(block: nn.Module, layer: int) -> None:
    saved: list[tuple[torch.Tensor, torch.Tensor | None, torch.device | None]] = []

    def enter(mod: nn.Module, args: tuple[Any, ...]) -> None:
        if not mod.training:
            return
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        cuda = device if device is not None and device.type == "cuda" else None
        saved.append(
            (torch.get_rng_state(), torch.cuda.get_rng_state(cuda) if cuda else None, cuda)
        )
        seed_micro_batch(derive_seed(torch.initial_seed(), layer) >> 1, cuda or torch.device("cpu"))

    def leave(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not mod.training or not saved:
            return
        cpu, cuda_state, cuda = saved.pop()
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda_state, cuda)

    block.register_forward_pre_hook(enter, prepend=True)
    block.register_forward_hook(leave, always_call=True)


def install_keyed_dropout(part: nn.Module) -> bool:
    """Key the dropout of a model part's blocks by layer and accept :data:`DROPOUT_SEED_KWARG`.

    Hooks the blocks of ``part.layers`` (inside any recompute wrapper; keys are
    the global layer numbers) and the part itself (the pipeline keyword). A part
    without dropout is left alone.

    Args:
        part: a model or pipeline stage with a ``layers`` ``ModuleDict``.

    Returns:
        Whether hooks were installed.
    """
    if not has_dropout(part):
        return False
    for key, slot in part.layers.items():
        _key_block(_unwrap(slot), int(key))

    def take_seed(
        mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        if DROPOUT_SEED_KWARG not in kwargs:
            return None
        kwargs = dict(kwargs)
        seeds = kwargs.pop(DROPOUT_SEED_KWARG)
        if mod.training:
            seed_micro_batch(int(seeds.reshape(-1)[0]), seeds.device)
        return args, kwargs

    part.register_forward_pre_hook(take_seed, with_kwargs=True, prepend=True)
    return True


def step_seeds(
    seed: int, step: int, num_microbatches: int, dp_rank: int = 0, dp_size: int = 1
) -> list[int]:
    """The seeds of a data-parallel rank's micro-batches of one step (:func:`micro_batch_seed`).

    Args:
        seed: ``training.seed``.
        step: the optimizer steps done before this one.
        num_microbatches: this rank's micro-batches in the step.
        dp_rank: this rank's data-parallel coordinate.
        dp_size: the data-parallel size.

    Returns:
        ``num_microbatches`` seeds, in this rank's micro-batch order (global
        micro-batches ``dp_rank, dp_rank + dp_size, ...``).
    """
    return [micro_batch_seed(seed, step, i * dp_size + dp_rank) for i in range(num_microbatches)]
