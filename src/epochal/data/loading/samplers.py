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

from collections.abc import Iterator, Sequence

from epochal.data.loading.padding import PAD
from epochal.data.loading.sampler_base import (
    Index,
    SamplerConfigError,
    _ceil_div,
    _check_int,
    _MegatronSamplerBase,
)
from epochal.data.loading.sampler_random import MegatronPretrainingRandomSampler

__all__ = [
    "MegatronPretrainingBatchSampler",
    "MegatronPretrainingRandomSampler",
    "MegatronPretrainingSampler",
    "SamplerConfigError",
]


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
