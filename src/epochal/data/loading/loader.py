"""``WrappedDataLoader``: a ``DataLoader`` with a required mode that resumes at the exact sample.

Why a mode: only the *train* loader resumes mid-way; validation, test and predict
loaders start from their beginning on every pass, so validation sees the same
samples every time. NeMo and BioNeMo default the mode to ``"train"``, so a
forgotten argument silently made a validation loader resume mid-way; here ``mode``
is required.

Why stateful: with a Megatron batch sampler (see :mod:`epochal.data.loading.samplers`, or
build the loader with :meth:`~epochal.data.data_sampler.MegatronDataSampler.transform_dataloader`)
the loader counts the micro-batches it has *delivered* (not the indices its workers
prefetched) and exposes the position as ``consumed_samples``. ``state_dict()`` /
``load_state_dict()`` follow the protocol of torchdata's ``StatefulDataLoader``, which
Lightning's fit loop also saves and restores, so a plain loop, epochal's trainer and
Lightning resume the same way. The state is ``{"consumed_samples": int, "mode": str}``;
``consumed_samples`` counts samples of all data-parallel ranks together, so it can be
loaded with a different data-parallel size (same global batch size).

A plain training loop (one data-parallel rank shown; ramp-up aware)::

    sampler = MegatronDataSampler(seq_len=1024, micro_batch_size=4, global_batch_size=64,
                                  data_parallel_rank=rank, data_parallel_size=dp)
    loader = sampler.transform_dataloader(WrappedDataLoader(train_ds, mode="train", num_workers=2))
    if checkpoint is not None:
        loader.load_state_dict(checkpoint["data"])   # before iterating
    batches = loader.stream()                         # continues across epochs
    for step in range(start_step, max_steps):
        for _ in range(sampler.num_microbatches_at(loader.consumed_samples)):
            micro_batch = next(batches)               # dict of tensors, shape [4, ...]
            ...forward / backward...
        optimizer.step()
        if step % save_every == 0:
            save({"data": loader.state_dict(), ...})  # {"consumed_samples": ..., "mode": "train"}

With a batch-size ramp-up the number of micro-batches per step grows with
``consumed_samples`` (Megatron's schedule); every micro-batch still has
``micro_batch_size`` samples per rank.

Padding positions (:data:`~epochal.data.padding.PAD`, only when the sampler does not
drop the last incomplete batch) are turned into fully loss-masked samples by a
:class:`~epochal.data.padding.PaddedDataset` view installed here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from epochal.data.loading.padding import PaddedDataset
from epochal.data.loading.samplers import (
    MegatronPretrainingBatchSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    SamplerConfigError,
)

__all__ = ["MODES", "DataExhaustedError", "LoaderStateError", "WrappedDataLoader"]

MODES = ("train", "validation", "test", "predict")
"""The allowed loader modes."""

MEGATRON_SAMPLERS = (
    MegatronPretrainingSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingBatchSampler,
)
_BATCHING_OPTIONS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")
_MISSING: Any = object()


class DataExhaustedError(ValueError):
    """A single-pass train loader was asked for a new pass after all its data was consumed."""


class LoaderStateError(ValueError):
    """A loader state that cannot be loaded (wrong keys, types, mode or position)."""


class _ResumableIterator(Iterator):
    """Iterates one pass of a loader and advances the loader's position per delivered item."""

    def __init__(self, loader: WrappedDataLoader, inner: Iterator, start: int) -> None:
        self._loader = loader
        self._inner = inner
        self._start = start
        self._delivered = 0
        sampler = loader.megatron_sampler
        track = sampler is not None and loader.mode == "train"
        self._consumed_after = sampler.consumed_after if track else None

    def __iter__(self) -> _ResumableIterator:
        return self

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except StopIteration:
            self._check_exhausted()
            raise
        self._delivered += 1
        if self._consumed_after is not None:
            self._loader._consumed_samples = self._consumed_after(self._start, self._delivered)
        return batch

    def _check_exhausted(self) -> None:
        loader = self._loader
        sampler = loader.megatron_sampler
        if self._delivered or loader.mode != "train" or sampler is None:
            return
        if sampler.remaining(self._start) == 0:
            raise DataExhaustedError(
                f"the train data is exhausted: consumed_samples={self._start} of total_samples="
                f"{sampler.total_samples} with a single-pass sampler ({type(sampler).__name__});"
                " build a longer dataset (e.g. a MultiEpochDatasetResampler with num_samples >="
                " max_steps * global_batch_size) or use dataloader_type='cyclic'"
            ) from None


class WrappedDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` that knows its mode and, with a Megatron sampler, its position.

    Args:
        dataset: the map-style dataset.
        mode: one of ``"train"``, ``"validation"``, ``"test"``, ``"predict"``; required.
        **dataloader_kwargs: any ``DataLoader`` option (``batch_size``, ``num_workers``,
            ``collate_fn``, ``pin_memory``, ``persistent_workers``, ``worker_init_fn``,
            ``batch_sampler``, ...). They are remembered, so
            :meth:`~epochal.data.data_sampler.MegatronDataSampler.transform_dataloader`
            can rebuild the loader with a Megatron batch sampler and every other option
            kept.

    Raises:
        TypeError: ``mode`` is missing.
        ValueError: ``mode`` is not one of :data:`MODES`.

    With a Megatron batch sampler (``batch_sampler=MegatronPretraining*Sampler(...)``):

    * a train loader starts every pass at :attr:`consumed_samples` and advances it by
      each delivered item; ``len(loader)`` is the number of items of a *whole* pass (it
      does not shrink on resume);
    * a validation/test/predict loader starts every pass at the sampler's initial
      position (normally 0) and ignores loaded positions;
    * a single-pass train loader raises :class:`DataExhaustedError` when a new pass is
      started after all data was consumed (instead of an endless series of empty
      epochs under Lightning).
    """

    def __init__(
        self, dataset: Any = _MISSING, *, mode: str = _MISSING, **dataloader_kwargs: Any
    ) -> None:
        if mode is _MISSING:
            raise TypeError(
                f"WrappedDataLoader needs mode=, one of {MODES}: there is no default because a"
                " validation loader given the train loader's mode would resume mid-way like it"
            )
        if mode not in MODES:
            raise ValueError(f"WrappedDataLoader mode must be one of {MODES}, got {mode!r}")
        if dataset is _MISSING:
            raise TypeError("WrappedDataLoader needs a dataset")
        user_kwargs = dict(dataloader_kwargs)
        batch_sampler = dataloader_kwargs.get("batch_sampler")
        megatron = batch_sampler if isinstance(batch_sampler, MEGATRON_SAMPLERS) else None
        source = dataset.dataset if isinstance(dataset, PaddedDataset) else dataset
        if megatron is not None and not megatron.drop_last:
            # The sampler may emit PAD: resolve it into loss-masked samples.
            dataset = PaddedDataset(source)
        super().__init__(dataset, **dataloader_kwargs)
        self.mode = mode
        self.source_dataset = source
        self._user_kwargs = user_kwargs
        self._megatron_sampler = megatron
        self._initial_consumed = megatron.consumed_samples if megatron is not None else 0
        self._consumed_samples = self._initial_consumed

    # ------------------------------------------------------------------ position
    @property
    def megatron_sampler(
        self,
    ) -> (
        MegatronPretrainingSampler
        | MegatronPretrainingRandomSampler
        | MegatronPretrainingBatchSampler
        | None
    ):
        """The Megatron batch sampler, or ``None`` for an ordinary loader."""
        return self._megatron_sampler

    @property
    def consumed_samples(self) -> int:
        """Position of the next pass: samples of all data-parallel ranks delivered so far (train mode).

        For other modes, the position every pass starts at. For a loader without a
        Megatron sampler, ``0``.
        """
        return self._consumed_samples if self.mode == "train" else self._initial_consumed

    def __iter__(self) -> Iterator[Any]:
        sampler = self._megatron_sampler
        if sampler is None:
            return super().__iter__()
        start = self.consumed_samples
        sampler.consumed_samples = start
        return _ResumableIterator(self, super().__iter__(), start)

    def stream(self) -> Iterator[Any]:
        """Items across passes: the train loader continues with the next epoch when one ends.

        Ends when a single-pass train loader has consumed all its data; for other modes
        it is one pass. Use it in plain loops that pull a number of micro-batches per
        step, so a step can run across an epoch boundary as in Megatron-LM.
        """
        while True:
            sampler = self._megatron_sampler
            if (
                self.mode == "train"
                and sampler is not None
                and sampler.remaining(self.consumed_samples) == 0
            ):
                return
            delivered = 0
            for item in self:
                delivered += 1
                yield item
            if self.mode != "train" or sampler is None or delivered == 0:
                return

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The resume state: ``{"consumed_samples": int, "mode": str}``.

        ``consumed_samples`` is present for loaders with a Megatron sampler; for
        validation/test/predict loaders it is the fixed start of their passes.
        """
        state: dict[str, Any] = {"mode": self.mode}
        if self._megatron_sampler is not None:
            state["consumed_samples"] = self.consumed_samples
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume at ``state_dict["consumed_samples"]`` (train mode; call before iterating).

        A validation/test/predict loader checks the state and keeps starting at its
        beginning. The position may come from a run with a different data-parallel size.

        Raises:
            LoaderStateError: not a mapping, unknown keys, a mode that differs from this
                loader's, a negative or non-integer position, a position the sampler cannot
                resume at, or a position given to a loader without a Megatron sampler.
        """
        if not isinstance(state_dict, Mapping):
            raise LoaderStateError(
                f"loader state must be a mapping, got {type(state_dict).__name__}"
            )
        unknown = set(state_dict) - {"consumed_samples", "mode"}
        if unknown:
            raise LoaderStateError(f"unknown keys in loader state: {sorted(unknown)}")
        mode = state_dict.get("mode", self.mode)
        if mode != self.mode:
            raise LoaderStateError(
                f"loader state is for mode {mode!r}, but this loader's mode is {self.mode!r}"
            )
        if "consumed_samples" not in state_dict:
            return
        consumed = state_dict["consumed_samples"]
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise LoaderStateError(f"consumed_samples must be an integer >= 0, got {consumed!r}")
        sampler = self._megatron_sampler
        if sampler is None:
            raise LoaderStateError(
                "this loader has no Megatron batch sampler, so it cannot resume at consumed_samples="
                f"{consumed}; build it with MegatronDataSampler.transform_dataloader"
            )
        if self.mode != "train":
            return
        try:
            sampler.check_consumed_samples(consumed)
        except SamplerConfigError as err:
            raise LoaderStateError(f"cannot resume at consumed_samples={consumed}: {err}") from None
        self._consumed_samples = consumed

    # ------------------------------------------------------------------ rebuilding
    def user_options(self) -> dict[str, Any]:
        """The ``DataLoader`` options this loader was created with (a copy; dataset excluded)."""
        return dict(self._user_kwargs)

    @classmethod
    def rebuild(cls, loader: WrappedDataLoader, batch_sampler: Any) -> WrappedDataLoader:
        """A new loader like ``loader`` (same dataset, mode and options) but with ``batch_sampler``.

        The options that define batching (``batch_size``, ``shuffle``, ``sampler``,
        ``batch_sampler``, ``drop_last``) are replaced by ``batch_sampler``; every other
        option is kept. The result remembers ``loader``'s original options.
        """
        options = {k: v for k, v in loader._user_kwargs.items() if k not in _BATCHING_OPTIONS}
        new = cls(loader.source_dataset, mode=loader.mode, batch_sampler=batch_sampler, **options)
        new._user_kwargs = dict(loader._user_kwargs)
        return new

    def __repr__(self) -> str:
        return (
            f"WrappedDataLoader(mode={self.mode!r}, batch_sampler={self._megatron_sampler!r}, "
            f"num_workers={self.num_workers}, consumed_samples={self.consumed_samples})"
        )
