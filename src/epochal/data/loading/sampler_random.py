"""Megatron's ``cyclic`` sampler: shuffled epochs, reshuffled every epoch, resumable from consumed samples.

See :mod:`epochal.data.loading.samplers` for positions, micro-blocks and resuming.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from epochal.data.epochs.permutation import derive_seed, permute_array
from epochal.data.loading.padding import PAD
from epochal.data.loading.sampler_base import (
    Index,
    SamplerConfigError,
    _ceil_div,
    _check_int,
    _MegatronSamplerBase,
)


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
