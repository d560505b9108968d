"""BlendedDataset: several datasets mixed by weight, sample for sample as Megatron-Core.

Megatron-Core's blend is greedy and has no randomness: sample ``t`` of the blend
comes from the dataset whose share lags most, i.e. the first ``i`` maximizing
``weights[i] * max(t, 1) - taken[i]`` (double precision, ties to the lower index),
and it is that dataset's next unused sample ``taken[i]``. Randomness comes from
the blended datasets themselves (each ``GPTDataset`` is shuffled by its seed).
:func:`build_blending_indices` and :func:`build_exhaustive_blending_indices`
reproduce Megatron's ``helpers.cpp`` exactly (same float operations, same
tie-breaking). Two datasets (the common case) take a vectorized exact scan (a few
hundred nanoseconds per sample, ~10x Megatron's C++); three or more take a plain
Python loop (about a microsecond per sample, so ~2 minutes for 10**8 samples); either
result is cached (see :mod:`epochal.data.index_cache`).

Each sample is ``{"dataset_id": i, **datasets[i][j]}``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from epochal.data.epoch_index import EpochIndex
from epochal.data.index_cache import cached_arrays, pickle_arrays, unpickle_arrays

#: Megatron stores dataset ids as int16.
MAX_DATASETS = 32767


def normalize_weights(weights: Sequence[float]) -> list[float]:
    """Return ``weights / sum(weights)`` computed in float64, as Megatron's ``normalize``.

    Raises:
        ValueError: empty, negative, non-finite or all-zero weights.
    """
    w = np.array(list(weights), dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError("weights must be a non-empty list of numbers")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or np.sum(w) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {list(weights)}")
    return (w / np.sum(w)).tolist()


#: Offsets of dataset 0's count from floor(w0 * t) tracked by the two-dataset scan.
_LOWEST_OFFSET = -1
_NUM_OFFSETS = 4
_ESCAPE = _NUM_OFFSETS  # an absorbing state: the offset left the tracked range
_STATES = _NUM_OFFSETS + 1
_SEGMENT = 1 << 20
_CHUNK = 1024
_BLOCK = 1 << 15


def _blend_two(w0: float, w1: float, size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact two-dataset greedy blend, vectorized; ``None`` if the scan leaves its state space.

    The count ``c0(t)`` of dataset 0 stays within a unit or two of ``floor(w0 * t)``,
    so each step is a transition on the few possible offsets ``c0(t) - floor(w0 * t)``,
    evaluated for every offset with the very float operations of the greedy rule
    (``w * max(t, 1) - count``, compared with ``>``). The transitions of all steps are
    computed at once; the offsets are then propagated chunk by chunk (every chunk from
    every entry offset at once, then the chunks in order): exact, and linear in ``size``.
    """
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    offsets = np.arange(_LOWEST_OFFSET, _LOWEST_OFFSET + _NUM_OFFSETS, dtype=np.int64)
    state = -_LOWEST_OFFSET  # c0(0) = 0 = floor(w0 * 0)
    for begin in range(0, size, _SEGMENT):
        length = min(_SEGMENT, size - begin)
        chunks = -(-length // _CHUNK)
        padded = chunks * _CHUNK
        t = np.arange(begin, begin + padded + 1, dtype=np.int64)
        reference = np.floor(w0 * t.astype(np.float64)).astype(np.int64)
        steps = t[:-1]
        table = np.full((padded, _STATES), _ESCAPE, dtype=np.int8)
        for lo in range(0, padded, _BLOCK):  # cache-sized blocks: no huge temporaries
            hi = min(lo + _BLOCK, padded)
            ref = reference[lo:hi]
            rf = ref.astype(np.float64)
            tf = steps[lo:hi].astype(np.float64)
            x = np.maximum(tf, 1.0)
            e0, e1 = w0 * x, w1 * x
            drift = ref - reference[lo + 1 : hi + 1] - _LOWEST_OFFSET
            for column, offset in enumerate(offsets.tolist()):
                # states off the real path (e.g. a negative count) are never reached, so
                # their transitions need no special care
                c0f = rf + offset  # exact: integers below 2**53
                pick_zero = e1 - (tf - c0f) <= e0 - c0f
                following = drift + pick_zero
                following += offset
                # negative or too large -> the escape state
                table[lo:hi, column] = np.minimum(following.view(np.uint64), _ESCAPE)
        # [step in chunk, chunk, state], contiguous per step
        table = np.ascontiguousarray(table.reshape(chunks, _CHUNK, _STATES).transpose(1, 0, 2))
        flat_tables = table.reshape(_CHUNK, chunks * _STATES)
        base = np.arange(chunks, dtype=np.intp) * _STATES
        # pass 1: the exit state of every chunk for every entry state
        current = np.tile(np.arange(_STATES, dtype=np.intp), chunks)
        row_base = np.repeat(base, _STATES)
        for j in range(_CHUNK):
            current = flat_tables[j].take(row_base + current).astype(np.intp)
        exits = current.reshape(chunks, _STATES).tolist()
        entries = np.empty(chunks, dtype=np.intp)
        for c in range(chunks):
            entries[c] = state
            state = exits[c][state]
        # pass 2: the state at every step, from each chunk's entry state
        per_step = np.empty((_CHUNK, chunks), dtype=np.intp)
        current = entries
        for j in range(_CHUNK):
            per_step[j] = current
            current = flat_tables[j].take(base + current).astype(np.intp)
        path = per_step.T.reshape(-1)[:length]
        steps = steps[:length]
        state = int(current[-1]) if length == padded else int(per_step[length % _CHUNK, -1])
        if state == _ESCAPE or np.any(path == _ESCAPE):
            return None
        count0 = np.empty(length + 1, dtype=np.int64)
        count0[:-1] = reference[:length] + offsets[path]
        count0[-1] = reference[length] + offsets[state]
        took0 = np.diff(count0)
        dataset_index[begin : begin + length] = 1 - took0
        before0 = count0[:-1]
        sample_index[begin : begin + length] = np.where(
            took0 == 1, before0, steps[:length] - before0
        )
    return dataset_index, sample_index


def build_blending_indices(weights: Sequence[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy blend of ``size`` samples; equal to Megatron's ``helpers.build_blending_indices``.

    Args:
        weights: normalized weights (float64), one per dataset.
        size: number of samples of the blend.

    Returns:
        ``(dataset_index, dataset_sample_index)``: int16 ``[size]`` and int64 ``[size]``.
    """
    w = [float(x) for x in weights]
    k = len(w)
    if k < 1 or k > MAX_DATASETS:
        raise ValueError(f"need 1 to {MAX_DATASETS} datasets, got {k}")
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    if k == 1:
        return np.zeros(size, dtype=np.int16), np.arange(size, dtype=np.int64)
    if k == 2:
        fast = _blend_two(w[0], w[1], size)
        if fast is not None:
            return fast
    return _greedy_loop(w, size)


def _greedy_loop(w: list[float], size: int) -> tuple[np.ndarray, np.ndarray]:
    """The greedy rule step by step (any number of datasets); about 0.5-1.5 us per sample."""
    k = len(w)
    picks = [0] * size
    positions = [0] * size
    taken = [0] * k
    others = range(1, k)
    for t in range(size):
        x = float(t) if t > 1 else 1.0
        best = 0
        best_error = w[0] * x - taken[0]
        for i in others:
            error = w[i] * x - taken[i]
            if error > best_error:
                best_error = error
                best = i
        picks[t] = best
        positions[t] = taken[best]
        taken[best] += 1
    return np.array(picks, dtype=np.int16), np.array(positions, dtype=np.int64)


def build_exhaustive_blending_indices(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Blend exactly ``sizes[i]`` samples of each dataset; equal to Megatron's exhaustive helper.

    The weights are ``sizes / sum(sizes)``; a dataset leaves the competition once all
    its samples are used.

    Returns:
        ``(dataset_index, dataset_sample_index)``: int16 and int64 arrays of length ``sum(sizes)``.
    """
    counts = [int(s) for s in sizes]
    k = len(counts)
    if k < 1 or k > MAX_DATASETS:
        raise ValueError(f"need 1 to {MAX_DATASETS} datasets, got {k}")
    if any(c < 0 for c in counts):
        raise ValueError(f"sizes must be >= 0, got {counts}")
    total = sum(counts)
    weights = [c / float(total) for c in counts] if total else [0.0] * k
    taken = [0] * k
    unspent = [i for i in range(k) if counts[i] > 0]
    picks = [0] * total
    positions = [0] * total
    for t in range(total):
        x = max(float(t), 1.0)
        best = -1
        best_error = -math.inf
        for i in unspent:
            error = weights[i] * x - taken[i]
            if error > best_error:
                best_error = error
                best = i
        picks[t] = best
        positions[t] = taken[best]
        taken[best] += 1
        if taken[best] == counts[best]:
            unspent.remove(best)
    return np.array(picks, dtype=np.int16), np.array(positions, dtype=np.int64)


class BlendedDataset(Dataset):
    """Megatron-Core's BlendedDataset: ``size`` samples drawn from ``datasets`` by ``weights``.

    Args:
        datasets: the datasets to blend (any ``__len__``/``__getitem__`` datasets whose
            samples are dicts, e.g. :class:`~epochal.data.gpt_dataset.GPTDataset`).
        weights: one positive weight per dataset, normalized here. With ``size=None``
            they must be whole numbers: exactly ``weights[i]`` samples of dataset ``i``
            are used (Megatron's exhaustive blend).
        size: samples in the blend, or ``None`` (see ``weights``).
        split: split name, part of the cache file names.
        cache_dir: where the two blend indices are cached; ``None`` = in memory.
        group: ``torch.distributed`` group whose rank 0 builds the cache.

    Attributes:
        dataset_index: int16 ``[len]``, which dataset serves each sample.
        dataset_sample_index: int64 ``[len]``, which sample of that dataset.
        weights: the normalized weights (or the counts when ``size`` is None).

    Raises:
        ValueError: mismatched lengths, no datasets, a non-positive weight, a negative
            size, or a blend that needs more samples from a dataset than it has (the
            message names the dataset; build it with more samples).
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        weights: Sequence[float],
        size: int | None,
        *,
        split: str = "train",
        cache_dir: str | os.PathLike | None = None,
        group: Any = None,
    ) -> None:
        datasets = list(datasets)
        weights = list(weights)
        if not datasets:
            raise ValueError("BlendedDataset needs at least one dataset")
        if len(datasets) != len(weights):
            raise ValueError(f"got {len(datasets)} datasets but {len(weights)} weights")
        if len(datasets) > MAX_DATASETS:
            raise ValueError(f"at most {MAX_DATASETS} datasets can be blended, got {len(datasets)}")
        for i, weight in enumerate(weights):
            if isinstance(weight, bool) or not isinstance(weight, int | float | np.number):
                raise ValueError(f"weight {i} must be a number, got {weight!r}")
            if not math.isfinite(float(weight)) or weight <= 0:
                raise ValueError(f"weight {i} must be finite and > 0, got {weight!r}")
        if size is None:
            if any(float(w) != int(w) for w in weights):
                raise ValueError(
                    f"with size=None the weights must be whole sample counts, got {weights}"
                )
            weights = [int(w) for w in weights]
        else:
            if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
                raise ValueError(f"size must be an int >= 0 or None, got {size!r}")
            size = int(size)
            weights = normalize_weights(weights)
        self.datasets = datasets
        self.weights = weights
        self.size = size
        self.split = split
        lengths = [len(d) for d in datasets]
        identity = {"weights": weights, "size": size, "dataset_lengths": lengths}

        def build() -> dict[str, np.ndarray]:
            if size is None:
                dataset_index, sample_index = build_exhaustive_blending_indices(weights)
            else:
                dataset_index, sample_index = build_blending_indices(weights, size)
            used = np.bincount(dataset_index, minlength=len(datasets))
            for i, (n_used, n_have) in enumerate(zip(used.tolist(), lengths)):
                if n_used > n_have:
                    raise ValueError(
                        f"the {split} blend needs {n_used} samples from dataset {i} "
                        f"({_name(datasets[i])}) but it has only {n_have}; build it with more samples "
                        "(e.g. raise mid_level_dataset_surplus)"
                    )
            return {"dataset_index": dataset_index, "dataset_sample_index": sample_index}

        arrays, self.cache_info = cached_arrays(
            cache_dir,
            type(self).__name__,
            split,
            identity,
            ("dataset_index", "dataset_sample_index"),
            build,
            group=group,
            note={"datasets": [_name(d) for d in datasets]},
        )
        self.dataset_index = arrays["dataset_index"]
        self.dataset_sample_index = arrays["dataset_sample_index"]

    def __len__(self) -> int:
        return int(self.dataset_index.shape[0])

    def __getitem__(self, idx: int | EpochIndex) -> dict[str, Any]:
        """Return ``{"dataset_id": i, **datasets[i][j]}`` for blend sample ``idx``.

        Raises:
            IndexError: ``idx`` out of range.
        """
        if isinstance(idx, EpochIndex):
            idx = idx.idx
        if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
            raise TypeError(f"BlendedDataset index must be an int, got {type(idx).__name__}")
        n = len(self)
        i = int(idx) + (n if int(idx) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"sample {int(idx)} out of range for BlendedDataset of length {n}")
        dataset_id = int(self.dataset_index[i])
        return {
            "dataset_id": dataset_id,
            **self.datasets[dataset_id][int(self.dataset_sample_index[i])],
        }

    _INDICES = ("dataset_index", "dataset_sample_index")

    def __getstate__(self) -> dict[str, Any]:
        """Pickle cached indices as their file names (workers map the files again)."""
        return pickle_arrays(self.__dict__, self._INDICES)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(unpickle_arrays(state, self._INDICES))

    def __repr__(self) -> str:
        return f"BlendedDataset(split={self.split}, datasets={len(self.datasets)}, samples={len(self)})"


def _name(dataset: Any) -> str:
    return str(getattr(dataset, "name", None) or type(dataset).__name__)
