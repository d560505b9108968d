"""Sampling with replacement in O(1) per index: ``PRNGResampleDataset``.

Sample ``i`` of the run is item ``resample_index(i, n, seed)`` of the underlying
dataset, where the drawn item is computed from a counter-based hash of
``(seed, i)`` (:func:`~epochal.data.permutation.derive_seed`, built on the
splitmix64 finalizer) reduced to ``range(n)`` by Lemire's multiply-shift with
rejection: ``m = h * n`` (128-bit); the draw is ``m >> 64`` unless the low half of
``m`` is below ``2**64 mod n``, in which case the next hash ``(seed, i, j)``,
``j = 1, 2, ...`` is tried. That rejection makes the reduction exactly uniform
(no modulo bias at all), and costs nothing in practice: its probability is
``(2**64 mod n) / 2**64 < n / 2**64``.

Unlike BioNeMo's ``PRNGResampleDataset`` (which replays a ``random.Random``
stream, so a backwards jump costs O(index)), any index in any order costs O(1),
and the object holds no mutable state, so it is safe to share between threads and
DataLoader workers. The draws differ from BioNeMo's for the same seed.
"""

from __future__ import annotations

import operator
from typing import Any, TypeVar

import numpy as np
from torch.utils.data import Dataset

from epochal.data.epochs.epoch_index import SizedDataset
from epochal.data.epochs.permutation import (
    MASK64,
    _as_u64_array,
    _check_bounded_int,
    _check_u64,
    derive_seed,
    derive_seed_array,
)

__all__ = ["PRNGResampleDataset", "resample_index", "resample_indices"]

T_co = TypeVar("T_co", covariant=True)

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _check_length(length: Any) -> int:
    return _check_bounded_int(length, "length", 1, MASK64, "[1, 2**64)")


def resample_index(index: int, length: int, seed: int) -> int:
    """Return the item drawn (uniformly, with replacement) for sample ``index``.

    Args:
        index: sample number, an integer in ``[0, 2**64)``.
        length: number of items to draw from, ``>= 1``.
        seed: integer in ``[0, 2**64)``.

    Returns:
        An integer in ``[0, length)``; a pure function of ``(index, length, seed)``.

    Raises:
        ValueError: an argument out of range. TypeError: a non-integer argument.
    """
    length = _check_length(length)
    h = derive_seed(seed, _check_u64(index, "index"))
    threshold = (1 << 64) % length
    j = 0
    while True:
        m = h * length
        if (m & MASK64) >= threshold:
            return m >> 64
        j += 1
        h = derive_seed(seed, index, j)


def _mul_64x64(a: np.ndarray, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(high, low)`` 64-bit halves of the 128-bit products ``a * b`` (uint64)."""
    b_lo, b_hi = np.uint64(b & 0xFFFFFFFF), np.uint64(b >> 32)
    a_lo, a_hi = a & _M32, a >> _S32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> _S32) + (hi_lo & _M32) + lo_hi  # < 2**64: no overflow
    high = a_hi * b_hi + (hi_lo >> _S32) + (cross >> _S32)
    low = (cross << _S32) | (lo_lo & _M32)
    return high, low


def resample_indices(indices: np.ndarray, length: int, seed: int) -> np.ndarray:
    """Vectorized :func:`resample_index`, for samplers and tools.

    Args:
        indices: non-negative integer array of any shape (sample numbers).
        length: number of items to draw from, ``>= 1``.
        seed: integer in ``[0, 2**64)``.

    Returns:
        ``int64`` array (``uint64`` if ``length > 2**63``) of ``indices.shape`` with
        ``out[j] == resample_index(indices[j], length, seed)``.

    Raises:
        ValueError: a negative index, or ``length``/``seed`` out of range.
        TypeError: a non-integer array.
    """
    length = _check_length(length)
    derive_seed(seed)  # validate
    arr = _as_u64_array(indices, "indices")
    shape = arr.shape
    h = derive_seed_array(seed, arr.reshape(-1))
    threshold = np.uint64((1 << 64) % length)
    high, low = _mul_64x64(h, length)
    todo = np.flatnonzero(low < threshold)
    flat = arr.reshape(-1)
    j = 0
    while todo.size:  # rare rejections: redraw only those
        j += 1
        h = derive_seed_array(seed, flat[todo], j)
        sub_high, sub_low = _mul_64x64(h, length)
        high[todo] = sub_high
        todo = todo[sub_low < threshold]
    out_dtype = np.int64 if length <= 1 << 63 else np.uint64
    return high.astype(out_dtype).reshape(shape)


class PRNGResampleDataset(Dataset[T_co]):
    """Draw ``num_samples`` samples with replacement from ``dataset``; ``ds[i]`` is O(1) for any ``i``.

    ``ds[i] == dataset[resample_index(i, len(dataset), seed)]``. Prefer
    :class:`~epochal.data.multi_epoch.MultiEpochDatasetResampler` (every item exactly once
    per epoch) unless sampling with replacement is what you want.

    Args:
        dataset: integer-indexed dataset with ``len(dataset) >= 1``.
        seed: integer in ``[0, 2**64)``.
        num_samples: number of samples, ``>= 0``; defaults to ``len(dataset)``.

    Raises:
        ValueError: empty dataset, negative ``num_samples``, seed out of range.
    """

    def __init__(self, dataset: SizedDataset[T_co], seed: int = 42, num_samples: int | None = None):
        """Store the dataset and validate the arguments (see the class docstring)."""
        n = len(dataset)
        if n < 1:
            raise ValueError("dataset is empty; PRNGResampleDataset needs len(dataset) >= 1")
        derive_seed(seed)  # validates type and range
        if num_samples is None:
            num_samples = n
        num_samples = operator.index(num_samples)
        if num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {num_samples}")
        self.dataset = dataset
        self.seed = operator.index(seed)
        self.num_samples = num_samples
        self.dataset_len = n

    def __len__(self) -> int:
        """Return ``num_samples``."""
        return self.num_samples

    def sample_index(self, index: int) -> int:
        """Return the item of ``dataset`` drawn for sample ``index``.

        Raises:
            IndexError: ``index`` is negative or ``>= len(self)``.
        """
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"index must be an integer, got {type(index).__name__}") from None
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} out of range for a dataset of {self.num_samples} samples")
        return resample_index(i, self.dataset_len, self.seed)

    def sample_indices(self, indices: np.ndarray) -> np.ndarray:
        """Vectorized :meth:`sample_index` (``int64`` array of ``indices.shape``).

        Raises:
            IndexError: a value out of range. TypeError: a non-integer array.
        """
        arr = np.asarray(indices)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"indices must be an integer array, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= self.num_samples):
            bad = arr.min() if arr.min() < 0 else arr.max()
            raise IndexError(
                f"index {bad} out of range for a dataset of {self.num_samples} samples"
            )
        return resample_indices(arr, self.dataset_len, self.seed)

    def __getitem__(self, index: int) -> T_co:
        """Return ``dataset[self.sample_index(index)]``."""
        return self.dataset[self.sample_index(index)]
