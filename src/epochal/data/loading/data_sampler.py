"""``MegatronDataSampler``: batch sizes, the resume point and loader transformation in one object.

Semantics follow NeMo's ``nemo.lightning.pytorch.plugins.MegatronDataSampler``
without Megatron-Core's global state: the data-parallel rank and size are given
explicitly (or read from an initialized ``torch.distributed`` world, treating it
as pure data parallelism), the micro-batch calculator is an object, and:

* :meth:`MegatronDataSampler.compute_consumed_samples` is exact under batch-size
  ramp-up (it adds the global batch size of every step; NeMo's is only right when
  called once per step);
* :meth:`MegatronDataSampler.transform_dataloader` keeps every ``DataLoader`` option
  the user passed (NeMo keeps only ``num_workers``, ``pin_memory``,
  ``persistent_workers`` and ``collate_fn``), and refuses loaders without a mode
  (NeMo treats them as train loaders, so they resumed mid-way);
* test and predict loaders always use the in-order single-pass sampler without
  dropping samples (each sample evaluated once), whatever ``dataloader_type``.

Typical use (see :mod:`epochal.data.loading.loader` for a whole training loop)::

    sampler = MegatronDataSampler(seq_len=2048, micro_batch_size=2, global_batch_size=512,
                                  rampup_batch_size=[32, 32, 2_000_000],
                                  data_parallel_rank=dp_rank, data_parallel_size=dp_size)
    train = sampler.transform_dataloader(WrappedDataLoader(train_ds, mode="train", num_workers=4))
    valid = sampler.transform_dataloader(WrappedDataLoader(valid_ds, mode="validation"))
    sampler.num_microbatches_at(train.consumed_samples)  # micro-batches of the next step
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal

from epochal.data.loading.loader import MODES, WrappedDataLoader
from epochal.data.loading.microbatches import (
    MicroBatchConfigError,
    NumMicroBatchesCalculator,
    build_num_microbatches_calculator,
    check_int,
)
from epochal.data.loading.samplers import (
    MegatronPretrainingBatchSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
)

__all__ = ["DATALOADER_TYPES", "DataSamplerConfigError", "MegatronDataSampler"]

DATALOADER_TYPES = ("single", "cyclic", "batch")
"""``single``: in order, one pass; ``cyclic``: reshuffled epochs; ``batch``: one item per global batch."""


class DataSamplerConfigError(ValueError):
    """An invalid :class:`MegatronDataSampler` option (the message names it)."""


_check_int = functools.partial(check_int, error=DataSamplerConfigError)


class MegatronDataSampler:
    """Micro/global batch sizes, ramp-up, loader type and the resume point of a run.

    Args:
        seq_len: sequence length in tokens (recorded for the trainer), ``>= 1``.
        micro_batch_size: samples per micro-batch per data-parallel rank, ``>= 1``.
        global_batch_size: samples per optimizer step over all data-parallel ranks (the
            final size when ramping up); a multiple of ``micro_batch_size *
            data_parallel_size``.
        rampup_batch_size: ``[start, increment, rampup_samples]`` (Megatron's
            ``--rampup-batch-size``), or ``None``.
        dataloader_type: ``"single"`` (in order, one pass; the dataset should already
            hold every epoch, e.g. a ``MultiEpochDatasetResampler``), ``"cyclic"``
            (reshuffled every epoch) or ``"batch"`` (one item per global batch).
        init_consumed_samples: where the train loader starts (the resume point), ``>= 0``.
        init_global_step: the optimizer step at which ``init_consumed_samples`` was
            reached, ``>= 0``.
        data_parallel_rank: this rank; with ``data_parallel_size``, or both ``None`` to
            read ``torch.distributed`` (rank / world size) when it is initialized, else
            ``0`` / ``1``.
        data_parallel_size: number of data-parallel ranks.
        seed: shuffle seed of ``"cyclic"``.
        global_shuffle: ``"cyclic"`` only: a shuffle independent of the data-parallel
            size (see :class:`~epochal.data.samplers.MegatronPretrainingRandomSampler`).
        data_sharding: ``"cyclic"`` only: ``False`` for Megatron's unsharded shuffle
            (``--no-data-sharding``; see
            :class:`~epochal.data.samplers.MegatronPretrainingRandomSampler`).
        pad_samples_to_global_batch_size: when a loader keeps its last incomplete global
            batch (test/predict, or ``drop_last=False``), complete it with loss-masked
            padding samples (always done for ``"batch"``).

    Raises:
        DataSamplerConfigError: any invalid option, including batch sizes that do not
            divide (checked for the given data-parallel size, or for 1 until it is known).
    """

    def __init__(
        self,
        seq_len: int,
        micro_batch_size: int,
        global_batch_size: int,
        rampup_batch_size: Sequence[int] | None = None,
        dataloader_type: Literal["single", "cyclic", "batch"] = "single",
        init_consumed_samples: int = 0,
        init_global_step: int = 0,
        *,
        data_parallel_rank: int | None = None,
        data_parallel_size: int | None = None,
        seed: int = 0,
        global_shuffle: bool = False,
        data_sharding: bool = True,
        pad_samples_to_global_batch_size: bool = False,
    ) -> None:
        self.seq_len = _check_int(seq_len, "seq_len", 1)
        self.micro_batch_size = _check_int(micro_batch_size, "micro_batch_size", 1)
        self.global_batch_size = _check_int(global_batch_size, "global_batch_size", 1)
        self.rampup_batch_size = None if rampup_batch_size is None else list(rampup_batch_size)
        if dataloader_type not in DATALOADER_TYPES:
            raise DataSamplerConfigError(
                f"dataloader_type must be one of {DATALOADER_TYPES}, got {dataloader_type!r}"
            )
        self.dataloader_type = dataloader_type
        self.init_consumed_samples = _check_int(init_consumed_samples, "init_consumed_samples", 0)
        self.init_global_step = _check_int(init_global_step, "init_global_step", 0)
        self.seed = _check_int(seed, "seed", 0)
        if not isinstance(global_shuffle, bool):
            raise DataSamplerConfigError(f"global_shuffle must be a bool, got {global_shuffle!r}")
        if global_shuffle and dataloader_type != "cyclic":
            raise DataSamplerConfigError(
                f"global_shuffle=True only applies to dataloader_type='cyclic', got {dataloader_type!r}"
            )
        self.global_shuffle = global_shuffle
        if not isinstance(data_sharding, bool):
            raise DataSamplerConfigError(f"data_sharding must be a bool, got {data_sharding!r}")
        if not data_sharding and dataloader_type != "cyclic":
            raise DataSamplerConfigError(
                f"data_sharding=False only applies to dataloader_type='cyclic', got {dataloader_type!r}"
            )
        if global_shuffle and not data_sharding:
            raise DataSamplerConfigError(
                "data_sharding=False (Megatron's unsharded shuffle) and global_shuffle=True"
                " (epochal's) exclude each other: choose one"
            )
        self.data_sharding = data_sharding
        if not isinstance(pad_samples_to_global_batch_size, bool):
            raise DataSamplerConfigError(
                f"pad_samples_to_global_batch_size must be a bool, got {pad_samples_to_global_batch_size!r}"
            )
        self.pad_samples_to_global_batch_size = pad_samples_to_global_batch_size
        if (data_parallel_rank is None) != (data_parallel_size is None):
            raise DataSamplerConfigError(
                "give both data_parallel_rank and data_parallel_size, or neither"
            )
        if data_parallel_size is not None:
            data_parallel_size = _check_int(data_parallel_size, "data_parallel_size", 1)
            data_parallel_rank = _check_int(data_parallel_rank, "data_parallel_rank", 0)
            if data_parallel_rank >= data_parallel_size:
                raise DataSamplerConfigError(
                    f"data_parallel_rank ({data_parallel_rank}) must be < data_parallel_size ({data_parallel_size})"
                )
        self._dp_rank = data_parallel_rank
        self._dp_size = data_parallel_size
        self._calculators: dict[int, NumMicroBatchesCalculator] = {}
        self._calculator_for(self._dp_size or 1)  # validate the batch sizes now

    # ------------------------------------------------------------------ parallel layout
    @property
    def data_parallel_rank(self) -> int:
        """This data-parallel rank (explicit, else ``torch.distributed``'s rank, else 0)."""
        return self._layout()[0]

    @property
    def data_parallel_size(self) -> int:
        """Number of data-parallel ranks (explicit, else ``torch.distributed``'s world size, else 1)."""
        return self._layout()[1]

    def _layout(self) -> tuple[int, int]:
        if self._dp_size is not None:
            assert self._dp_rank is not None
            return self._dp_rank, self._dp_size
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _calculator_for(self, data_parallel_size: int) -> NumMicroBatchesCalculator:
        calc = self._calculators.get(data_parallel_size)
        if calc is None:
            try:
                calc = build_num_microbatches_calculator(
                    self.global_batch_size,
                    self.micro_batch_size,
                    data_parallel_size,
                    self.rampup_batch_size,
                )
            except MicroBatchConfigError as err:
                raise DataSamplerConfigError(
                    f"{err} (data_parallel_size={data_parallel_size})"
                ) from None
            self._calculators[data_parallel_size] = calc
        return calc

    @property
    def calculator(self) -> NumMicroBatchesCalculator:
        """The micro-batch calculator for the current data-parallel size."""
        return self._calculator_for(self.data_parallel_size)

    # ------------------------------------------------------------------ batch sizes
    def num_microbatches_at(self, consumed_samples: int) -> int:
        """Micro-batches per rank in the step that starts at ``consumed_samples``."""
        return self.calculator.num_microbatches_at(consumed_samples)

    def global_batch_size_at(self, consumed_samples: int) -> int:
        """Global batch size (samples, all ranks) of the step that starts at ``consumed_samples``."""
        return self.calculator.running_global_batch_size_at(consumed_samples)

    def compute_consumed_samples(self, steps_since_resume: int = 0) -> int:
        """Consumed samples after ``steps_since_resume`` steps from ``init_consumed_samples``.

        Exact under ramp-up: each step adds the global batch size at the position where
        it starts.

        Args:
            steps_since_resume: optimizer steps since ``init_global_step``, ``>= 0``.

        Returns:
            Samples consumed over all data-parallel ranks.

        Raises:
            DataSamplerConfigError: a negative step count (e.g. ``init_global_step`` was
                not updated after a resume; see
                :meth:`~epochal.data.datamodule.MegatronDataModule.update_init_global_step`).
        """
        steps = _check_int(steps_since_resume, "steps_since_resume", 0)
        return self.calculator.consumed_samples_after(steps, self.init_consumed_samples)

    # ------------------------------------------------------------------ loaders
    def transform_dataloader(
        self, dataloader: WrappedDataLoader, consumed_samples: int | None = None
    ) -> WrappedDataLoader:
        """Rebuild ``dataloader`` with this configuration's Megatron batch sampler.

        Every ``DataLoader`` option the loader was created with is kept except the ones
        that define batching (``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``;
        an explicit ``drop_last`` is honoured). Train loaders start at
        ``consumed_samples`` (default ``init_consumed_samples``); other modes at 0.
        ``drop_last`` defaults to ``True`` for train/validation and ``False`` for
        test/predict (NeMo's choice).

        Args:
            dataloader: a :class:`~epochal.data.loader.WrappedDataLoader` (it carries the mode).
            consumed_samples: resume point of a train loader; ``None`` for
                ``init_consumed_samples``.

        Returns:
            A new :class:`~epochal.data.loader.WrappedDataLoader`.

        Raises:
            TypeError: ``dataloader`` is not a ``WrappedDataLoader`` (without a mode it
                cannot be told apart from a train loader).
            DataSamplerConfigError: ``batch_size`` differs from ``micro_batch_size``,
                ``shuffle=True`` or a custom sampler was passed (they would be silently
                replaced), or ``consumed_samples`` was given for a non-train loader.
            epochal.data.samplers.SamplerConfigError: the dataset does not fit the
                configuration (e.g. ``global_shuffle`` on fewer samples than a global batch).
        """
        if not isinstance(dataloader, WrappedDataLoader):
            raise TypeError(
                f"transform_dataloader needs a WrappedDataLoader(mode=...), got {type(dataloader).__name__}:"
                f" without a mode it cannot tell a train loader (which resumes) from an evaluation loader"
            )
        mode = dataloader.mode
        assert mode in MODES
        options = dataloader.user_options()
        batch_size = options.get("batch_size")
        if (
            self.dataloader_type != "batch"
            and batch_size is not None
            and batch_size != self.micro_batch_size
        ):
            raise DataSamplerConfigError(
                f"the {mode} loader was given batch_size={batch_size}, but micro_batch_size is"
                f" {self.micro_batch_size}; leave batch_size out (the Megatron sampler sets it)"
            )
        if options.get("shuffle"):
            raise DataSamplerConfigError(
                f"the {mode} loader was given shuffle=True; the order is set by dataloader_type"
                " ('cyclic' reshuffles every epoch)"
            )
        for key in ("sampler", "batch_sampler"):
            if options.get(key) is not None and dataloader.megatron_sampler is None:
                raise DataSamplerConfigError(
                    f"the {mode} loader was given {key}=; it would be replaced by the Megatron sampler"
                )
        if consumed_samples is not None and mode != "train":
            raise DataSamplerConfigError(
                f"consumed_samples was given for a {mode} loader; only train loaders resume mid-way"
            )
        start = 0
        if mode == "train":
            start = self.init_consumed_samples if consumed_samples is None else consumed_samples
            start = _check_int(start, "consumed_samples", 0)
        drop_last = bool(options.get("drop_last", mode in ("train", "validation")))
        try:
            total_samples = len(dataloader.source_dataset)
        except TypeError:
            raise TypeError(
                f"the {mode} loader's dataset ({type(dataloader.source_dataset).__name__}) has no len();"
                " Megatron samplers need a map-style dataset of known length"
            ) from None
        batch_sampler = self._build_batch_sampler(total_samples, start, mode, drop_last)
        return WrappedDataLoader.rebuild(dataloader, batch_sampler)

    def _build_batch_sampler(
        self, total_samples: int, consumed: int, mode: str, drop_last: bool
    ) -> Any:
        rank, size = self._layout()
        self._calculator_for(size)  # clear error if the batch sizes do not divide for this size
        rampup = self.rampup_batch_size if mode == "train" else None
        kind = self.dataloader_type
        if kind == "cyclic" and mode in ("test", "predict"):
            kind = "single"
        if kind == "batch":
            return MegatronPretrainingBatchSampler(
                total_samples=total_samples,
                consumed_samples=consumed,
                micro_batch_size=self.micro_batch_size,
                global_batch_size=self.global_batch_size,
                data_parallel_rank=rank,
                data_parallel_size=size,
                drop_last=drop_last,
                pad_samples_to_global_batch_size=not drop_last,
                rampup_batch_size=rampup,
            )
        if kind == "cyclic":
            return MegatronPretrainingRandomSampler(
                total_samples=total_samples,
                consumed_samples=consumed,
                micro_batch_size=self.micro_batch_size,
                data_parallel_rank=rank,
                data_parallel_size=size,
                drop_last=drop_last,
                global_batch_size=self.global_batch_size,
                seed=self.seed,
                global_shuffle=self.global_shuffle,
                data_sharding=self.data_sharding,
            )
        return MegatronPretrainingSampler(
            total_samples=total_samples,
            consumed_samples=consumed,
            micro_batch_size=self.micro_batch_size,
            data_parallel_rank=rank,
            data_parallel_size=size,
            drop_last=drop_last,
            global_batch_size=self.global_batch_size,
            pad_samples_to_global_batch_size=self.pad_samples_to_global_batch_size
            and not drop_last,
            rampup_batch_size=rampup,
        )

    def __repr__(self) -> str:
        return (
            f"MegatronDataSampler(seq_len={self.seq_len}, micro_batch_size={self.micro_batch_size},"
            f" global_batch_size={self.global_batch_size}, rampup_batch_size={self.rampup_batch_size},"
            f" dataloader_type={self.dataloader_type!r}, init_consumed_samples={self.init_consumed_samples},"
            f" init_global_step={self.init_global_step})"
        )
