"""``MegatronDataModule``: a Lightning data module whose ``state_dict`` resumes at the exact sample.

Needs Lightning (``pip install epochal[lightning]``). Semantics follow BioNeMo's
``bionemo.llm.data.datamodule.MegatronDataModule`` (``update_init_global_step``,
``state_dict() -> {"consumed_samples": ...}``, ``load_state_dict``), on Lightning
alone (no NeMo ``MegatronStrategy``: the module transforms its own loaders).

Subclass it and write the dataloader hooks as usual, returning
:class:`~epochal.data.loader.WrappedDataLoader` objects with the hook's mode::

    class MyData(MegatronDataModule):
        def __init__(self):
            super().__init__(MegatronDataSampler(seq_len=128, micro_batch_size=2, global_batch_size=8))

        def train_dataloader(self):
            return WrappedDataLoader(self.train_ds, mode="train", num_workers=2)

        def val_dataloader(self):
            return WrappedDataLoader(self.valid_ds, mode="validation")

Every hook a subclass defines is wrapped (``__init_subclass__``) so that:

* the returned loader is rebuilt by ``data_sampler.transform_dataloader`` (Megatron
  batch sampler, every other option kept), and a loader whose mode does not match
  the hook (e.g. a ``mode="train"`` loader from ``val_dataloader``) is an error;
* ``train_dataloader`` first calls :meth:`MegatronDataModule.update_init_global_step`,
  so forgetting it (BioNeMo's documented source of double-counted samples after a
  resume) is impossible; calling it yourself as well is harmless.

With ``Trainer(accumulate_grad_batches=k)`` each Lightning batch is one micro-batch and
``global_batch_size`` must equal ``micro_batch_size * data_parallel_size * k``; with a
batch-size ramp-up, write ``training_step(self, dataloader_iter)`` and take
``self.trainer.datamodule.num_microbatches`` micro-batches per step. A ``cyclic`` train
loader whose epoch ends would fall inside a step (a ramp-up that does not end at a
multiple of ``global_batch_size``, or ``drop_last=False``) is refused: Lightning would
end the epoch there and drop the step. :meth:`state_dict`
checks that the samples counted from the optimizer steps equal the samples the train
loader delivered, and raises if they differ (a configuration that would resume at the
wrong sample).

Lightning's fit loop also saves and restores the train loader's own ``state_dict``
(the same ``consumed_samples``); restoring applies the datamodule's position when
the loader is built and then the loop's, which is equal. With more than one process
use ``Trainer(use_distributed_sampler=False)``: the Megatron samplers already split
the data between data-parallel ranks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as err:  # pragma: no cover - exercised only without the optional extra
    raise ImportError(
        "epochal.data.MegatronDataModule needs Lightning: pip install 'epochal[lightning]'"
    ) from err

from epochal.data.loading.data_sampler import DataSamplerConfigError, MegatronDataSampler
from epochal.data.loading.loader import WrappedDataLoader
from epochal.data.loading.samplers import MegatronPretrainingRandomSampler

__all__ = ["DataModuleStateError", "MegatronDataModule"]

_HOOK_MODES = {
    "train_dataloader": "train",
    "val_dataloader": "validation",
    "test_dataloader": "test",
    "predict_dataloader": "predict",
}


class DataModuleStateError(RuntimeError):
    """The data module's resume bookkeeping is inconsistent (the message says what to fix)."""


def _check_steps_fit_epochs(loader: WrappedDataLoader, data_sampler: MegatronDataSampler) -> None:
    """Refuse a ``cyclic`` train loader whose epochs would end inside a training step.

    Lightning ends its epoch when a pass of the train loader ends; a step still taking
    micro-batches then stops with ``StopIteration`` and is discarded, so its samples are
    never trained and the step count no longer matches the position (the run would resume
    at another sample). Epoch ends are multiples of the sampler's active epoch length;
    steps follow the ramp-up schedule from position 0, then have ``global_batch_size``.

    Raises:
        DataSamplerConfigError: a step would run across the end of an epoch.
    """
    sampler = loader.megatron_sampler
    if not isinstance(sampler, MegatronPretrainingRandomSampler):
        return
    epoch, calc = sampler.active_total_samples, data_sampler.calculator
    start, problem = 0, None
    while problem is None and calc.in_rampup(start):
        size = calc.running_global_batch_size_at(start)
        if start // epoch != (start + size - 1) // epoch:
            problem = f"the ramp-up step at sample {start} ({size} samples) crosses an epoch end"
        start += size
    if problem is None:
        size = calc.running_global_batch_size_at(start)
        if start % size == 0 and epoch % size == 0:
            return  # every later epoch end is a step end
        problem = f"the steps of {size} samples from sample {start} on miss some epoch ends"
    raise DataSamplerConfigError(
        f"the cyclic train loader's epochs of {epoch} samples end inside a training step"
        f" ({problem}): Lightning would end the epoch there and drop that step"
        f" (rampup_batch_size={data_sampler.rampup_batch_size}, global_batch_size="
        f"{data_sampler.global_batch_size}, drop_last={sampler.drop_last}). Choose a ramp-up"
        " that ends at a multiple of global_batch_size and keep drop_last=True, or use"
        " dataloader_type='single' over a MultiEpochDatasetResampler"
    )


def _wrap_hook(fn: Callable[[Any], Any], mode: str) -> Callable[[Any], Any]:
    @functools.wraps(fn)
    def hook(self: MegatronDataModule) -> Any:
        if mode == "train":
            self.update_init_global_step()
        loaders = fn(self)
        result = self._transform_loaders(loaders, mode, fn.__qualname__)
        if mode == "train":
            self._train_loader = result if isinstance(result, WrappedDataLoader) else None
        return result

    hook._epochal_wrapped = True  # type: ignore[attr-defined]
    return hook


class MegatronDataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` with Megatron samplers and exact resumption.

    Args:
        data_sampler: the :class:`~epochal.data.data_sampler.MegatronDataSampler`; a
            subclass may instead assign ``self.data_sampler`` in its ``__init__``.

    Attributes:
        data_sampler: the data sampler (batch sizes, loader type, resume point).
        init_global_step: the trainer step at which the current train loader started.
    """

    def __init__(self, data_sampler: MegatronDataSampler | None = None) -> None:
        super().__init__()
        self.data_sampler = data_sampler
        self.init_global_step = 0
        self._resume_pending = False
        self._train_loader: WrappedDataLoader | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, mode in _HOOK_MODES.items():
            fn = cls.__dict__.get(name)
            if callable(fn) and not getattr(fn, "_epochal_wrapped", False):
                setattr(cls, name, _wrap_hook(fn, mode))

    # ------------------------------------------------------------------ helpers
    def _sampler(self) -> MegatronDataSampler:
        if not isinstance(self.data_sampler, MegatronDataSampler):
            raise DataModuleStateError(
                f"{type(self).__name__}.data_sampler must be a MegatronDataSampler, got"
                f" {type(self.data_sampler).__name__}; pass it to MegatronDataModule.__init__"
            )
        return self.data_sampler

    def _global_step(self) -> int:
        trainer = self.trainer
        return int(trainer.global_step) if trainer is not None else 0

    def _transform_loaders(self, loaders: Any, mode: str, where: str) -> Any:
        if isinstance(loaders, list | tuple):
            return type(loaders)(self._transform_loaders(dl, mode, where) for dl in loaders)
        if isinstance(loaders, Mapping):
            return {k: self._transform_loaders(dl, mode, where) for k, dl in loaders.items()}
        if not isinstance(loaders, WrappedDataLoader):
            raise TypeError(
                f"{where} must return WrappedDataLoader(..., mode={mode!r}), got {type(loaders).__name__}"
            )
        if loaders.mode != mode:
            raise ValueError(
                f"{where} returned a WrappedDataLoader with mode={loaders.mode!r}; it must be {mode!r}"
                + (
                    " (a non-train mode would never resume)"
                    if mode == "train"
                    else " (only train loaders resume)"
                )
            )
        loader = self._sampler().transform_dataloader(loaders)
        if mode == "train":
            _check_steps_fit_epochs(loader, self._sampler())
        return loader

    # ------------------------------------------------------------------ resume bookkeeping
    def update_init_global_step(self) -> None:
        """Anchor the resume point at the trainer's current step (called by ``train_dataloader``).

        After :meth:`load_state_dict`, the loaded ``consumed_samples`` is anchored at
        the restored ``trainer.global_step``. Otherwise (e.g. when Lightning reloads the
        train loader every epoch), the samples of the steps run since the last anchor
        are added first. Calling it twice at the same step changes nothing.
        """
        sampler = self._sampler()
        step = self._global_step()
        if not self._resume_pending:
            sampler.init_consumed_samples = sampler.compute_consumed_samples(
                step - sampler.init_global_step
            )
        sampler.init_global_step = step
        self.init_global_step = step
        self._resume_pending = False

    @property
    def consumed_samples(self) -> int:
        """Samples consumed by the optimizer steps so far (all data-parallel ranks)."""
        sampler = self._sampler()
        if self._resume_pending:
            return sampler.init_consumed_samples
        steps = self._global_step() - sampler.init_global_step
        if steps < 0:
            raise DataModuleStateError(
                f"trainer.global_step ({self._global_step()}) is before init_global_step"
                f" ({sampler.init_global_step}); call update_init_global_step() after restoring a checkpoint"
            )
        return sampler.compute_consumed_samples(steps)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per data-parallel rank in the current step (changes under ramp-up)."""
        return self._sampler().num_microbatches_at(self.consumed_samples)

    @property
    def current_global_batch_size(self) -> int:
        """Global batch size (samples, all ranks) of the current step."""
        return self._sampler().global_batch_size_at(self.consumed_samples)

    def state_dict(self) -> dict[str, Any]:
        """``{"consumed_samples": int}``: the samples of all optimizer steps so far.

        A checkpoint taken inside a step (e.g. after a validation run in the middle of
        gradient accumulation) records the start of that step; the loader's own state
        (saved by Lightning's fit loop) records the micro-batches already delivered,
        matching Lightning's own mid-step restart.

        Raises:
            DataModuleStateError: the train loader's position is not within the current
                step (e.g. ``accumulate_grad_batches`` does not match ``global_batch_size``,
                or a training step skipped or added micro-batches), so the run would resume
                at the wrong sample.
        """
        consumed = self.consumed_samples
        loader = self._train_loader
        if loader is not None and loader.megatron_sampler is not None:
            sampler = self._sampler()
            delivered = loader.consumed_samples
            step_end = consumed + sampler.global_batch_size_at(consumed)
            # delivered == consumed at a step boundary, and is less than a step ahead inside one
            if not consumed <= delivered < step_end:
                raise DataModuleStateError(
                    f"the train loader delivered samples up to position {delivered}, but"
                    f" {self._global_step() - sampler.init_global_step} optimizer steps from"
                    f" {sampler.init_consumed_samples} account for {consumed} (global_batch_size="
                    f"{sampler.global_batch_size}, micro_batch_size={sampler.micro_batch_size},"
                    f" data_parallel_size={sampler.data_parallel_size}); each step must consume"
                    " exactly num_microbatches micro-batches (Trainer(accumulate_grad_batches=...)"
                    " must match), or the run would resume at the wrong sample"
                )
        return {"consumed_samples": consumed}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume at ``state_dict["consumed_samples"]`` (anchored when the train loader is built).

        Raises:
            DataModuleStateError: a missing or invalid ``consumed_samples``.
        """
        if not isinstance(state_dict, Mapping) or "consumed_samples" not in state_dict:
            raise DataModuleStateError(
                f"{type(self).__name__} state must be a mapping with 'consumed_samples', got {state_dict!r}"
            )
        consumed = state_dict["consumed_samples"]
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise DataModuleStateError(
                f"consumed_samples must be an integer >= 0, got {consumed!r}"
            )
        self._sampler().init_consumed_samples = consumed
        self._resume_pending = True
        self._train_loader = None  # a loader built before the load no longer tells the position
