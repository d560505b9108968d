"""Megatron-style batch samplers: each data-parallel rank's micro-batches, resumable from consumed samples.

A *position* is the number of a sample in the run's global order, counted over all
data-parallel ranks; ``consumed_samples`` is the position where the next pass
starts, and it is the only resume state. A *micro-block* is ``micro_batch_size *
data_parallel_size`` consecutive positions; rank ``r`` takes the slice ``[r *
micro_batch_size, (r + 1) * micro_batch_size)`` of every micro-block as its
micro-batch. A training step (one global batch) is ``global_batch_size / (
micro_batch_size * data_parallel_size)`` consecutive micro-blocks.

The samplers are batch samplers for ``torch.utils.data.DataLoader(batch_sampler=...)``;
each item is a list of dataset indices. They never change their own state while
iterating (NeMo's random sampler advances ``consumed_samples`` as indices are drawn,
so DataLoader workers that prefetch make it run ahead of the model):
:class:`~epochal.data.loader.WrappedDataLoader` counts the micro-batches actually
delivered and resumes from that count via :meth:`consumed_after`.

Padding positions are the sentinel :data:`~epochal.data.padding.PAD`, never a
negative index (see :mod:`epochal.data.loading.padding`).

``len(sampler)`` is the number of items of one *whole* pass (from the start of the
data or of an epoch), whatever ``consumed_samples`` is, so it does not shrink every
time a run resumes (a NeMo bug: progress bars and Lightning's epoch accounting lost
the consumed batches on every restart; Lightning adds the batches it already ran
in the epoch itself).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from epochal.data.epochs.permutation import derive_seed, permute_array
from epochal.data.loading.microbatches import (
    MicroBatchConfigError,
    NumMicroBatchesCalculator,
    build_num_microbatches_calculator,
    check_int,
)
from epochal.data.loading.padding import PAD, PaddingIndex

__all__ = [
    "MegatronPretrainingBatchSampler",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "SamplerConfigError",
]

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


class MegatronPretrainingSampler(_MegatronSamplerBase):
    """Single pass over positions ``consumed_samples .. total_samples - 1`` in order (Megatron's ``single``).

    Sample index == position. Each item is this rank's micro-batch (a list of
    ``micro_batch_size`` indices) of the next micro-block.

    End of the data:

    * ``drop_last=True`` (default): an incomplete last micro-block is dropped; if
      ``global_batch_size`` is given, the pass stops after the last *complete global
      batch* (so a training step never runs short; with ramp-up the global batches are
      those of the ramp-up schedule, counted from position 0).
    * ``drop_last=False``: the incomplete last micro-block is split as usual, so some
      ranks get a short micro-batch; a rank left with nothing gets ``[PAD]``.
    * ``pad_samples_to_global_batch_size=True`` (needs ``drop_last=False`` and
      ``global_batch_size``): the incomplete last global batch is completed with
      :data:`~epochal.data.padding.PAD`, so every rank gets full micro-batches and the
      last step has its usual number of micro-batches.

    Args:
        total_samples: number of positions (``len(dataset)``), ``>= 1``.
        consumed_samples: position where iteration starts, ``0 <= consumed_samples <=
            total_samples`` (or up to the end of the padding, which counts as consumed).
        micro_batch_size: indices per item, ``>= 1``.
        data_parallel_rank: this rank, ``0 <= rank < data_parallel_size``.
        data_parallel_size: number of data-parallel ranks, ``>= 1``.
        drop_last: see above.
        global_batch_size: samples per step (all ranks), a multiple of ``micro_batch_size
            * data_parallel_size``; optional.
        pad_samples_to_global_batch_size: see above.
        rampup_batch_size: ``[start, increment, rampup_samples]`` of a batch-size ramp-up
            (needs ``global_batch_size``, the final size); optional.

    Raises:
        SamplerConfigError: any invalid value (each message names the option).
    """

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
        super().__init__(
            total_samples,
            consumed_samples,
            micro_batch_size,
            data_parallel_rank,
            data_parallel_size,
            drop_last,
            global_batch_size,
            pad_samples_to_global_batch_size,
            rampup_batch_size,
        )
        block = self.micro_batch_times_data_parallel_size
        n = self.total_samples
        # Positions [0, data_end) are yielded; the pass ends at pass_end (>= data_end with padding).
        self._data_end = n
        if self.calculator is not None and self.drop_last:
            _, self._data_end = self.calculator.complete_steps_within(0, n)
        if self.pad_samples_to_global_batch_size:
            assert self.calculator is not None
            _, full = self.calculator.complete_steps_within(0, n)
            self._pass_end = (
                full if full == n else full + self.calculator.running_global_batch_size_at(full)
            )
        else:
            self._pass_end = self._data_end
        # The last position: padding positions count as consumed (a padded step is a whole
        # global batch, as the step count says), so a pass may end beyond the data.
        self._end = max(self._pass_end, n)
        if self.drop_last:
            self._len = self._data_end // block
        else:
            self._len = _ceil_div(self._pass_end, block)
        self._check_consumed(self.consumed_samples)

    def _check_consumed(self, consumed: int) -> int:
        consumed = _check_int(consumed, "consumed_samples", 0)
        if consumed > self._end:
            raise SamplerConfigError(
                f"consumed_samples ({consumed}) is beyond the end of the data (total_samples="
                f"{self.total_samples}"
                + (f", padded to {self._end}" if self._end > self.total_samples else "")
                + "); a single-pass sampler cannot resume there"
            )
        return consumed

    def __len__(self) -> int:
        """Micro-batches of one whole pass from position 0 (independent of ``consumed_samples``)."""
        return self._len

    def __iter__(self) -> Iterator[list[Index]]:
        start = self._check_consumed(self.consumed_samples)
        block, mbs = self.micro_batch_times_data_parallel_size, self.micro_batch_size
        n = self.total_samples
        if start >= self._end:  # all data (and padding) consumed
            return
        end = self._data_end if self.drop_last else n
        p, lo = start, start + self.data_parallel_rank * mbs
        while p + block <= end:  # whole micro-blocks of real samples: this rank's slice directly
            yield list(range(lo, lo + mbs))
            p += block
            lo += block
        if self.drop_last:
            return
        # the tail: a short micro-block, or padding up to the end of the global batch
        while p < self._pass_end:
            stop = min(p + block, self._pass_end)
            positions: list[Index] = [q if q < n else PAD for q in range(p, stop)]
            yield self._rank_slice(positions)
            p = stop

    def consumed_after(self, start: int, num_batches: int) -> int:
        """Position after ``num_batches`` items of a pass that started at ``start``.

        Padding positions count (a padded last global batch ends at its full size).
        """
        return min(start + num_batches * self.micro_batch_times_data_parallel_size, self._end)

    def remaining(self, start: int) -> int:
        """Items a pass starting at ``start`` yields (0 when the data is exhausted)."""
        block = self.micro_batch_times_data_parallel_size
        if start >= self._end:
            return 0
        if self.drop_last:
            return max(0, (self._data_end - start) // block)
        return _ceil_div(self._pass_end - start, block)


class MegatronPretrainingRandomSampler(_MegatronSamplerBase):
    """Shuffled epochs, reshuffled every epoch (Megatron's ``cyclic`` loader).

    One pass (``iter``) is the rest of the current epoch; the next pass continues with
    the next epoch. Epoch ``e`` covers positions ``[e * A, (e + 1) * A)``, where the
    active epoch length ``A = total_samples - total_samples % U`` with ``U =
    global_batch_size`` if given, else ``micro_batch_size * data_parallel_size``
    (Megatron: the remainder is skipped every epoch). ``epoch = consumed_samples // A``
    and ``consumed_samples % A`` must be a multiple of ``micro_batch_size *
    data_parallel_size``. Using the global batch size as ``U`` (Megatron uses the
    micro-block) makes every epoch a whole number of training steps, so Lightning's
    epoch boundary never falls inside a step.

    Two shuffles:

    * ``global_shuffle=False`` (default; Megatron-LM / NeMo semantics, same indices as
      NeMo for ``U`` = micro-block): the active samples ``[0, A)`` are cut into one
      contiguous bucket per rank, and each bucket is shuffled with
      ``torch.randperm(A // dp, generator=manual_seed(seed + epoch))``. The samples a
      rank sees depend on the data-parallel size, so resuming on a different number of
      GPUs changes the order; the last ``total_samples % U`` samples are never used.
    * ``data_sharding=False`` (Megatron-LM's ``--no-data-sharding``): one
      ``torch.randperm(total_samples - total_samples % micro_batch_size,
      generator=manual_seed(seed + epoch))`` of the whole dataset; positions ``[0, A)``
      of it are the epoch, and rank ``r`` takes every ``dp``-th of them starting at
      ``r``, ``micro_batch_size`` at a time. Every micro-block (hence every global
      batch) then holds the same samples whatever the data-parallel size, only their
      assignment to ranks changes. Megatron lets a rank read past ``A`` into the
      skipped remainder (with ``micro_batch_size=1`` rank 0 can get one micro-batch
      more than the others); here every rank stops at ``A``.
    * ``global_shuffle=True`` (epochal): epoch ``e``'s global order is the O(1)-memory
      permutation ``permute_array(positions, total_samples, derive_seed(seed, e))`` of
      all samples; its first ``A`` entries are used (so the skipped remainder changes
      every epoch) and rank ``r`` takes its slice of every micro-block. The sample at
      every position depends only on ``(seed, position, total_samples,
      global_batch_size)``, not on the data-parallel or micro-batch size, so an elastic
      resume keeps the global order. Needs ``global_batch_size`` (a micro-block
      based epoch length would depend on the data-parallel size).

    ``drop_last=False`` keeps the remainder as a last, short micro-block of every epoch
    (``A = total_samples``): supported with ``global_shuffle=True``, or when there is no
    remainder; Megatron's bucketed shuffle cannot split it. Padding is not supported.

    Args:
        total_samples: dataset length (one epoch), ``>= 1``.
        consumed_samples: position where iteration starts (any epoch), ``>= 0``.
        micro_batch_size: indices per item, ``>= 1``.
        data_parallel_rank: this rank, ``0 <= rank < data_parallel_size``.
        data_parallel_size: number of data-parallel ranks, ``>= 1``.
        drop_last: see above.
        global_batch_size: samples per step (all ranks); the epoch unit ``U``; needed by
            ``global_shuffle``.
        pad_samples_to_global_batch_size: must be ``False``.
        seed: shuffle seed, ``0 <= seed < 2**63``.
        global_shuffle: see above.
        data_sharding: ``False`` for Megatron's unsharded shuffle (see above); only with
            ``global_shuffle=False``.

    Raises:
        SamplerConfigError: any invalid value, an epoch shorter than one unit, or a
            position that is not at a micro-block boundary of its epoch.
    """

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
        seed: int = 0,
        global_shuffle: bool = False,
        data_sharding: bool = True,
    ) -> None:
        if pad_samples_to_global_batch_size:
            raise SamplerConfigError(
                "MegatronPretrainingRandomSampler does not pad (pad_samples_to_global_batch_size=True);"
                " use MegatronPretrainingSampler (dataloader_type='single') for padded evaluation"
            )
        super().__init__(
            total_samples,
            consumed_samples,
            micro_batch_size,
            data_parallel_rank,
            data_parallel_size,
            drop_last,
            global_batch_size,
            False,
        )
        self.seed = _check_int(seed, "seed", 0)
        if self.seed >= 2**63:
            raise SamplerConfigError(f"seed must be < 2**63, got {self.seed}")
        if not isinstance(global_shuffle, bool):
            raise SamplerConfigError(f"global_shuffle must be a bool, got {global_shuffle!r}")
        self.global_shuffle = global_shuffle
        if not isinstance(data_sharding, bool):
            raise SamplerConfigError(f"data_sharding must be a bool, got {data_sharding!r}")
        if global_shuffle and not data_sharding:
            raise SamplerConfigError(
                "data_sharding=False selects Megatron's unsharded shuffle, global_shuffle=True"
                " epochal's: choose one"
            )
        self.data_sharding = data_sharding
        block = self.micro_batch_times_data_parallel_size
        if global_shuffle and self.global_batch_size is None:
            raise SamplerConfigError(
                "global_shuffle=True needs global_batch_size: the epoch length is a multiple of it, so"
                " that it does not depend on the data-parallel size"
            )
        unit = self.global_batch_size if self.global_batch_size is not None else block
        self.epoch_unit = unit
        n = self.total_samples
        if n < unit:
            raise SamplerConfigError(
                f"total_samples ({n}) is smaller than one "
                + (
                    "global batch"
                    if self.global_batch_size is not None
                    else "micro_batch_size * data_parallel_size"
                )
                + f" ({unit}): an epoch would be empty"
            )
        if drop_last:
            self.active_total_samples = n - n % unit
        else:
            if not global_shuffle and n % block:
                raise SamplerConfigError(
                    f"drop_last=False needs global_shuffle=True when total_samples ({n}) is not a multiple of"
                    f" micro_batch_size * data_parallel_size ({block}): Megatron's per-rank buckets cannot"
                    " split the remainder"
                )
            self.active_total_samples = n
        self.last_batch_size = n - self.active_total_samples
        self._check_consumed(self.consumed_samples)

    def epoch_at(self, consumed_samples: int) -> int:
        """The epoch that position ``consumed_samples`` belongs to."""
        return consumed_samples // self.active_total_samples

    def _check_consumed(self, consumed: int) -> tuple[int, int]:
        consumed = _check_int(consumed, "consumed_samples", 0)
        epoch, offset = divmod(consumed, self.active_total_samples)
        if offset % self.micro_batch_times_data_parallel_size:
            raise SamplerConfigError(
                f"consumed_samples ({consumed}) is {offset} samples into epoch {epoch}, which is not a multiple"
                f" of micro_batch_size * data_parallel_size ({self.micro_batch_times_data_parallel_size});"
                " resume at a step boundary"
            )
        return epoch, offset

    def __len__(self) -> int:
        """Micro-batches of one whole epoch (independent of ``consumed_samples``)."""
        return _ceil_div(self.active_total_samples, self.micro_batch_times_data_parallel_size)

    def __iter__(self) -> Iterator[list[Index]]:
        epoch, offset = self._check_consumed(self.consumed_samples)
        if self.global_shuffle:
            yield from self._iter_global(epoch, offset)
        elif self.data_sharding:
            yield from self._iter_buckets(epoch, offset)
        else:
            yield from self._iter_unsharded(epoch, offset)

    def _iter_buckets(self, epoch: int, offset: int) -> Iterator[list[Index]]:
        dp, mbs = self.data_parallel_size, self.micro_batch_size
        bucket_size = self.active_total_samples // dp
        bucket_offset = offset // dp
        start_idx = self.data_parallel_rank * bucket_size
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        order = torch.randperm(bucket_size, generator=g)[bucket_offset:]
        order += start_idx
        indices = order.tolist()
        for i in range(0, len(indices) - mbs + 1, mbs):
            yield indices[i : i + mbs]

    def _iter_unsharded(self, epoch: int, offset: int) -> Iterator[list[Index]]:
        mbs = self.micro_batch_size
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        order = torch.randperm(self.total_samples - self.total_samples % mbs, generator=g)
        mine = order[offset + self.data_parallel_rank : self.active_total_samples]
        indices = mine[:: self.data_parallel_size].tolist()
        for i in range(0, len(indices) - mbs + 1, mbs):
            yield indices[i : i + mbs]

    def _iter_global(self, epoch: int, offset: int) -> Iterator[list[Index]]:
        block, mbs = self.micro_batch_times_data_parallel_size, self.micro_batch_size
        epoch_seed = derive_seed(self.seed, epoch)
        n, active = self.total_samples, self.active_total_samples
        first = offset + self.data_parallel_rank * mbs  # position of this rank's first sample
        count = _ceil_div(active - offset, block)  # micro-batches left in the epoch
        columns = np.arange(mbs, dtype=np.int64)
        done, chunk = 0, 16
        while done < count:
            # Map a chunk of micro-batches in one vectorized call; chunks grow so that the
            # first micro-batch after a resume is cheap and later ones amortize the call.
            rows = np.arange(done, min(done + chunk, count), dtype=np.int64)
            positions = first + rows[:, None] * block + columns[None, :]
            full = int(np.count_nonzero(positions[:, -1] < active))
            if full:
                yield from permute_array(positions[:full], n, epoch_seed).tolist()
            for row in positions[full:]:  # the short last micro-block of a drop_last=False epoch
                real = row[row < active]
                yield permute_array(real, n, epoch_seed).tolist() if real.size else [PAD]
            done += len(rows)
            chunk = min(chunk * 4, 4096)

    def consumed_after(self, start: int, num_batches: int) -> int:
        """Position after ``num_batches`` items of a pass that started at ``start``."""
        epoch_end = (start // self.active_total_samples + 1) * self.active_total_samples
        return min(start + num_batches * self.micro_batch_times_data_parallel_size, epoch_end)

    def remaining(self, start: int) -> int:
        """Items a pass starting at ``start`` yields (the rest of its epoch; never 0)."""
        offset = start % self.active_total_samples
        return _ceil_div(
            self.active_total_samples - offset, self.micro_batch_times_data_parallel_size
        )


class MegatronPretrainingBatchSampler(_MegatronSamplerBase):
    """Single pass in order, one item per *global batch* (NeMo's ``batch`` loader, for fine-tuning).

    Each item is this rank's share of the next global batch: positions ``p + r, p + r +
    dp, ...`` of the global batch ``[p, p + g)`` (interleaved across ranks like NeMo),
    ``g / dp`` indices, so a collate function sees every sample of the rank's step at
    once (e.g. to pad variable-length samples to one length); the trainer splits it into
    ``g / (micro_batch_size * dp)`` micro-batches. Global batches follow the ramp-up
    schedule if ``rampup_batch_size`` is given. ``consumed_samples`` must be at a
    global-batch boundary.

    End of the data: ``drop_last=True`` drops an incomplete last global batch;
    otherwise it is yielded short (a rank left with nothing gets ``[PAD]``), or completed
    with :data:`~epochal.data.padding.PAD` if ``pad_samples_to_global_batch_size``.

    Args:
        total_samples: number of positions, ``>= 1``.
        consumed_samples: position where iteration starts.
        micro_batch_size: micro-batch size (the global batch must be a multiple of it
            times ``data_parallel_size``).
        global_batch_size: samples per step (all ranks); required.
        data_parallel_rank: this rank.
        data_parallel_size: number of data-parallel ranks.
        drop_last: see above.
        pad_samples_to_global_batch_size: see above.
        rampup_batch_size: ``[start, increment, rampup_samples]``; optional.

    Raises:
        SamplerConfigError: any invalid value.
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        global_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
        pad_samples_to_global_batch_size: bool = False,
        rampup_batch_size: Sequence[int] | None = None,
    ) -> None:
        if global_batch_size is None:
            raise SamplerConfigError("MegatronPretrainingBatchSampler needs global_batch_size")
        super().__init__(
            total_samples,
            consumed_samples,
            micro_batch_size,
            data_parallel_rank,
            data_parallel_size,
            drop_last,
            global_batch_size,
            pad_samples_to_global_batch_size,
            rampup_batch_size,
        )
        assert self.calculator is not None
        self._full_steps, self._full_end = self.calculator.complete_steps_within(
            0, self.total_samples
        )
        has_partial = self._full_end < self.total_samples
        self._len = self._full_steps + (1 if has_partial and not self.drop_last else 0)
        # The last position: a padded last global batch counts whole, as the step count says.
        self._end = self.total_samples
        if has_partial and self.pad_samples_to_global_batch_size:
            self._end = self._full_end + self.calculator.running_global_batch_size_at(
                self._full_end
            )
        self._check_consumed(self.consumed_samples)

    def _check_consumed(self, consumed: int) -> int:
        consumed = _check_int(consumed, "consumed_samples", 0)
        if consumed > self._end:
            raise SamplerConfigError(
                f"consumed_samples ({consumed}) is beyond the end of the data (total_samples="
                f"{self.total_samples}"
                + (f", padded to {self._end}" if self._end > self.total_samples else "")
                + ")"
            )
        assert self.calculator is not None
        if consumed < self.total_samples:
            _, boundary = self.calculator.complete_steps_within(0, consumed)
            if boundary != consumed:
                raise SamplerConfigError(
                    f"consumed_samples ({consumed}) is not at a global-batch boundary (the step containing it"
                    f" starts at {boundary}); the batch sampler resumes only between steps"
                )
        return consumed

    def __len__(self) -> int:
        """Global batches of one whole pass from position 0 (independent of ``consumed_samples``)."""
        return self._len

    def __iter__(self) -> Iterator[list[Index]]:
        assert self.calculator is not None
        start = self._check_consumed(self.consumed_samples)
        n, dp, r = self.total_samples, self.data_parallel_size, self.data_parallel_rank
        for p, g in self.calculator.iter_global_batches(start):
            if p >= n:
                return
            if p + g <= n:
                yield list(range(p + r, p + g, dp))
                continue
            if self.drop_last:
                return
            indices: list[Index] = list(range(p + r, n, dp))
            if self.pad_samples_to_global_batch_size:
                indices += [PAD] * (g // dp - len(indices))
            yield indices if indices else [PAD]
            return

    def consumed_after(self, start: int, num_batches: int) -> int:
        """Position after ``num_batches`` items of a pass that started at ``start`` (padding counts)."""
        assert self.calculator is not None
        return min(self.calculator.consumed_samples_after(num_batches, start), self._end)

    def remaining(self, start: int) -> int:
        """Items a pass starting at ``start`` yields (0 when the data is exhausted)."""
        assert self.calculator is not None
        steps, end = self.calculator.complete_steps_within(start, self.total_samples)
        return steps + (1 if end < self.total_samples and not self.drop_last else 0)
