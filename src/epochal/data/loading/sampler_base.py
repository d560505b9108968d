"""What every Megatron-style batch sampler shares: the configuration checks, the rank's slice of a micro-block, resume positions.

See :mod:`epochal.data.loading.samplers` for positions, micro-blocks and resuming.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from epochal.data.loading.microbatches import (
    MicroBatchConfigError,
    NumMicroBatchesCalculator,
    build_num_microbatches_calculator,
    check_int,
)
from epochal.data.loading.padding import PAD, PaddingIndex

Index = int | PaddingIndex


class SamplerConfigError(ValueError):
    """An invalid sampler configuration or resume position (the message names the option)."""


_check_int = functools.partial(check_int, error=SamplerConfigError)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _MegatronSamplerBase(ABC):
    """Validation and the attributes shared by the samplers (see the module docstring)."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
        global_batch_size: int | None = None,
        pad_samples_to_global_batch_size: bool = False,
        rampup_batch_size: Sequence[int] | None = None,
    ) -> None:
        self.total_samples = _check_int(total_samples, "total_samples", 1)
        self.consumed_samples = _check_int(consumed_samples, "consumed_samples", 0)
        self.micro_batch_size = _check_int(micro_batch_size, "micro_batch_size", 1)
        self.data_parallel_size = _check_int(data_parallel_size, "data_parallel_size", 1)
        self.data_parallel_rank = _check_int(data_parallel_rank, "data_parallel_rank", 0)
        if self.data_parallel_rank >= self.data_parallel_size:
            raise SamplerConfigError(
                f"data_parallel_rank ({self.data_parallel_rank}) must be < data_parallel_size "
                f"({self.data_parallel_size})"
            )
        if not isinstance(drop_last, bool):
            raise SamplerConfigError(f"drop_last must be a bool, got {drop_last!r}")
        if not isinstance(pad_samples_to_global_batch_size, bool):
            raise SamplerConfigError(
                f"pad_samples_to_global_batch_size must be a bool, got {pad_samples_to_global_batch_size!r}"
            )
        self.drop_last = drop_last
        self.pad_samples_to_global_batch_size = pad_samples_to_global_batch_size
        self.micro_batch_times_data_parallel_size = self.micro_batch_size * self.data_parallel_size
        self.rampup_batch_size = None if rampup_batch_size is None else list(rampup_batch_size)
        self.calculator: NumMicroBatchesCalculator | None = None
        if global_batch_size is None:
            self.global_batch_size = None
            if rampup_batch_size is not None:
                raise SamplerConfigError(
                    "rampup_batch_size needs global_batch_size (the final global batch size)"
                )
        else:
            self.global_batch_size = _check_int(global_batch_size, "global_batch_size", 1)
            try:
                self.calculator = build_num_microbatches_calculator(
                    self.global_batch_size,
                    self.micro_batch_size,
                    self.data_parallel_size,
                    rampup_batch_size,
                )
            except MicroBatchConfigError as err:
                raise SamplerConfigError(str(err)) from None
        if pad_samples_to_global_batch_size:
            if global_batch_size is None:
                raise SamplerConfigError(
                    "pad_samples_to_global_batch_size=True needs global_batch_size"
                )
            if drop_last:
                raise SamplerConfigError(
                    "pad_samples_to_global_batch_size=True needs drop_last=False (with drop_last=True"
                    " the incomplete last global batch is dropped, so there is nothing to pad)"
                )

    def check_consumed_samples(self, consumed_samples: int) -> int:
        """Validate a resume position for this sampler and return it.

        Raises:
            SamplerConfigError: the sampler cannot start a pass at ``consumed_samples``.
        """
        self._check_consumed(consumed_samples)
        return consumed_samples

    @abstractmethod
    def _check_consumed(self, consumed: int) -> Any:
        """Validate ``consumed`` as the start of a pass (raises :class:`SamplerConfigError`)."""

    @abstractmethod
    def __iter__(self) -> Iterator[list[Index]]:
        """This rank's items of one pass starting at ``self.consumed_samples``."""

    @abstractmethod
    def __len__(self) -> int:
        """Items of one whole pass (independent of ``consumed_samples``)."""

    @abstractmethod
    def consumed_after(self, start: int, num_batches: int) -> int:
        """Position after ``num_batches`` items of a pass that started at ``start``."""

    @abstractmethod
    def remaining(self, start: int) -> int:
        """Items a pass starting at ``start`` yields."""

    def _rank_slice(self, block: list[Index]) -> list[Index]:
        """This rank's micro-batch of a (possibly partial) micro-block; never empty."""
        start = self.data_parallel_rank * self.micro_batch_size
        part = block[start : start + self.micro_batch_size]
        # A partial last micro-block can leave a rank nothing: give it one padding sample
        # so every rank runs the same number of micro-batches (collectives stay matched).
        return part if part else [PAD]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(total_samples={self.total_samples}, consumed_samples={self.consumed_samples},"
            f" micro_batch_size={self.micro_batch_size}, data_parallel_rank={self.data_parallel_rank},"
            f" data_parallel_size={self.data_parallel_size}, drop_last={self.drop_last},"
            f" global_batch_size={self.global_batch_size})"
        )
