"""Multi-epoch resampling: Megatron's global sample index -> ``EpochIndex`` -> sample.

:class:`MultiEpochDatasetResampler` turns a :class:`~epochal.data.epoch_index.MultiEpochDataset`
of ``n`` items into a dataset of ``num_samples`` samples for Megatron's sequential
samplers: global index ``g`` is epoch ``g // n``, position ``g % n``, and position
``p`` of epoch ``e`` is item ``permute(p, n, derive_seed(seed, e))``. Each epoch is a
fresh, independent shuffle; nothing is stored per epoch, so a run of ``10**12``
samples costs no more memory than one of ``10``.

:class:`MultiEpochDatasetWrapper` adapts a plain integer-indexed dataset into a
``MultiEpochDataset`` with a per-epoch transform. Names and semantics follow
BioNeMo's ``bionemo.core.data.multi_epoch_dataset``; the differences are listed
in :class:`MultiEpochDatasetResampler`.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
from torch.utils.data import Dataset

from epochal.data.epochs.epoch_index import EpochIndex, MultiEpochDataset, SizedDataset
from epochal.data.epochs.permutation import (
    MAX_LENGTH,
    _encrypt_int,
    _round_keys,
    derive_seed,
    derive_seed_array,
    permute_array,
    permute_grouped,
)

__all__ = [
    "IdentityMultiEpochDatasetWrapper",
    "MultiEpochDatasetResampler",
    "MultiEpochDatasetWrapper",
    "as_epoch_index",
]

_SHORT_EPOCH = 1 << 16
"""Below this many items an epoch is too short to map range by range (see ``epoch_indices``)."""

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
U_co = TypeVar("U_co", covariant=True)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


@dataclass
class MultiEpochDatasetResampler(Dataset[T_co]):
    """Serve ``num_samples`` samples of a multi-epoch dataset, reshuffled every epoch.

    ``resampler[g]`` returns ``dataset[EpochIndex(e, permute(g % n, n, derive_seed(seed, e)))]``
    with ``n = len(dataset)`` and ``e = g // n`` (no permutation when ``shuffle=False``).
    The result depends only on ``(seed, g)``: the same on every rank, worker and restart.

    Give at most one of ``num_epochs`` and ``num_samples`` (neither means one epoch).
    ``num_samples`` that is not a multiple of ``n`` cuts the last epoch short: its
    first ``num_samples % n`` positions are served, so those items are seen once
    more than the rest.

    Differences from BioNeMo: the per-epoch seed is a hash of ``(seed, epoch)``
    rather than a table of ``num_epochs`` random seeds (O(1) memory for any number of
    epochs), the permutation is valid for any length (including 1), and
    :meth:`epoch_indices` / :meth:`map_indices` map many indices at once. The orders
    therefore differ from BioNeMo's for the same seed.

    Attributes:
        dataset: the dataset to resample; indexed by ``EpochIndex``; ``len(dataset) >= 1``.
        num_epochs: number of full epochs, ``>= 1``.
        num_samples: total number of samples, ``>= 1``.
        shuffle: shuffle the items of every epoch (otherwise ``idx = g % n``).
        seed: integer in ``[0, 2**64)``.

    Raises:
        ValueError: both counts given, a count ``< 1``, an empty dataset, a seed out of range.
        TypeError: a count or the seed is not an integer.
    """

    dataset: MultiEpochDataset[T_co]
    num_epochs: int | None = None
    num_samples: int | None = None
    shuffle: bool = True
    seed: int = 42
    _n: int = field(init=False, repr=False)
    _bits: int = field(init=False, repr=False)
    _last_epoch_keys: tuple[int, tuple[int, ...]] | None = field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        """Validate the arguments and resolve ``num_epochs`` / ``num_samples``."""
        if self.num_epochs is not None and self.num_samples is not None:
            raise ValueError(
                "give only one of num_epochs and num_samples, got "
                f"num_epochs={self.num_epochs}, num_samples={self.num_samples}"
            )
        n = len(self.dataset)
        if n < 1:
            raise ValueError("dataset is empty; MultiEpochDatasetResampler needs len(dataset) >= 1")
        if n > MAX_LENGTH:
            raise ValueError(f"len(dataset) must be <= 2**63, got {n}")
        self._n = n
        self._bits = (n - 1).bit_length()
        derive_seed(self.seed)  # validates the seed (type and range)
        self.seed = operator.index(self.seed)
        if self.num_samples is not None:
            self.num_samples = _positive_int(self.num_samples, "num_samples")
            self.num_epochs = -(-self.num_samples // n)
        else:
            epochs = 1 if self.num_epochs is None else self.num_epochs
            self.num_epochs = _positive_int(epochs, "num_epochs")
            self.num_samples = n * self.num_epochs

    def __len__(self) -> int:
        """Return the number of samples, ``num_samples``."""
        return self.num_samples  # type: ignore[return-value]

    def epoch_seed(self, epoch: int) -> int:
        """Return the permutation seed of ``epoch`` (``derive_seed(seed, epoch)``)."""
        return derive_seed(self.seed, epoch)

    def epoch_index(self, index: int) -> EpochIndex:
        """Map global sample ``index`` to its ``EpochIndex``.

        Raises:
            IndexError: ``index`` is negative or ``>= len(self)``.
            TypeError: ``index`` is not an integer.
        """
        try:
            g = operator.index(index)
        except TypeError:
            raise TypeError(f"index must be an integer, got {type(index).__name__}") from None
        if not 0 <= g < self.num_samples:  # type: ignore[operator]
            raise IndexError(
                f"index {g} out of range for a resampler of {self.num_samples} samples"
            )
        epoch, idx = divmod(g, self._n)
        if self.shuffle and self._n > 1:
            # same result as permute(idx, n, derive_seed(seed, epoch)), with the round keys
            # of the last epoch kept: consecutive indices mostly share an epoch
            cached = self._last_epoch_keys
            if cached is None or cached[0] != epoch:
                cached = (epoch, _round_keys(derive_seed(self.seed, epoch), self._bits))
                self._last_epoch_keys = cached
            keys = cached[1]
            idx = _encrypt_int(idx, self._bits, keys)
            while idx >= self._n:
                idx = _encrypt_int(idx, self._bits, keys)
        return EpochIndex(epoch, idx)

    def __getitem__(self, index: int) -> T_co:
        """Return ``dataset[self.epoch_index(index)]``.

        Raises:
            IndexError: ``index`` is negative or ``>= len(self)`` (no negative wrap-around).
        """
        return self.dataset[self.epoch_index(index)]

    def __getitems__(self, indices: list[int]) -> list[T_co]:
        """Return the samples of a list of global indices (used by ``DataLoader``).

        Calls the dataset's own ``__getitems__`` with the ``EpochIndex`` list when it has one.
        """
        keys = [self.epoch_index(i) for i in indices]
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return getitems(keys)
        return [self.dataset[k] for k in keys]

    def sample_identity(self, index: int) -> dict[str, Any]:
        """``{"epoch": e, **identity}`` of global sample ``index`` without reading it.

        ``identity`` is the dataset's ``sample_identity(EpochIndex(e, idx))`` when it has
        one (e.g. ESM-2's cluster, a table's row), else ``{"index": idx}``.

        Raises:
            IndexError / TypeError: as :meth:`epoch_index`.
        """
        return self._identity(self.epoch_index(index))

    def sample_identities(self, start: int, stop: int) -> list[dict[str, Any]]:
        """:meth:`sample_identity` of global samples ``start .. stop - 1`` (epochs mapped at once).

        Raises:
            IndexError: the range is not inside ``[0, len(self)]`` or ``start > stop``.
        """
        epochs, idx = self.epoch_indices(start, stop)
        return [self._identity(EpochIndex(e, i)) for e, i in zip(epochs.tolist(), idx.tolist())]

    def _identity(self, key: EpochIndex) -> dict[str, Any]:
        inner = getattr(self.dataset, "sample_identity", None)
        return {"epoch": key.epoch, **(inner(key) if inner is not None else {"index": key.idx})}

    def epoch_indices(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Return the ``EpochIndex`` values of global indices ``start .. stop-1`` as arrays.

        Args:
            start: first global index, ``0 <= start <= stop``.
            stop: one past the last global index, ``<= len(self)``.

        Returns:
            ``(epochs, idx)``: two ``int64`` arrays of shape ``(stop - start,)`` with
            ``EpochIndex(epochs[j], idx[j]) == self.epoch_index(start + j)``.

        Raises:
            IndexError: the range is not inside ``[0, len(self)]`` or ``start > stop``.
        """
        start, stop = operator.index(start), operator.index(stop)
        if not 0 <= start <= stop <= self.num_samples:  # type: ignore[operator]
            raise IndexError(
                f"range [{start}, {stop}) is not inside [0, {self.num_samples}] (start <= stop)"
            )
        n = self._n
        if n < _SHORT_EPOCH and (stop - 1) // n - start // n > 1:
            # many short epochs: one call with gathered per-epoch keys beats a call per epoch
            return self.map_indices(np.arange(start, stop, dtype=np.int64))
        epochs = np.empty(stop - start, dtype=np.int64)
        idx = np.empty(stop - start, dtype=np.int64)
        pos = start
        while pos < stop:  # one segment per epoch touched by the range
            epoch, offset = divmod(pos, n)
            seg_stop = min(stop, (epoch + 1) * n)
            out = slice(pos - start, seg_stop - start)
            local = np.arange(offset, offset + (seg_stop - pos), dtype=np.int64)
            epochs[out] = epoch
            idx[out] = (
                permute_array(local, n, derive_seed(self.seed, epoch)) if self.shuffle else local
            )
            pos = seg_stop
        return epochs, idx

    def map_indices(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`epoch_index` for an arbitrary integer array of global indices.

        Args:
            indices: integer array of any shape, values in ``[0, len(self))``.

        Returns:
            ``(epochs, idx)``: ``int64`` arrays of ``indices.shape``.

        Raises:
            IndexError: a value is out of range. TypeError: a non-integer array.
        """
        g = np.asarray(indices)
        if g.dtype == np.bool_ or not np.issubdtype(g.dtype, np.integer):
            raise TypeError(f"indices must be an integer array, got dtype {g.dtype}")
        if g.size and (g.min() < 0 or g.max() >= self.num_samples):
            bad = g.min() if g.min() < 0 else g.max()
            raise IndexError(
                f"index {bad} out of range for a resampler of {self.num_samples} samples"
            )
        g = g.astype(np.int64, copy=False)
        epochs, idx = np.divmod(g, self._n)
        if self.shuffle and g.size:
            flat = epochs.reshape(-1)
            first, last = int(flat.min()), int(flat.max())
            if last - first < flat.size:  # seeds of the epochs spanned, gathered per index
                table = derive_seed_array(self.seed, np.arange(first, last + 1, dtype=np.int64))
                group = flat - first
            else:
                uniq, group = np.unique(flat, return_inverse=True)
                table = derive_seed_array(self.seed, uniq)
            idx = permute_grouped(idx.reshape(-1), self._n, table, group.reshape(-1)).reshape(
                g.shape
            )
        return epochs, idx


def as_epoch_index(index: Any) -> EpochIndex:
    """Return ``index`` as an :class:`EpochIndex` (accepts an ``(epoch, idx)`` pair).

    Raises:
        TypeError: ``index`` is not an ``(epoch, idx)`` pair of integers (a plain integer
            is rejected: wrap the dataset in :class:`MultiEpochDatasetResampler`).
    """
    if isinstance(index, EpochIndex):
        return index
    if isinstance(index, tuple) and len(index) == 2:
        try:
            return EpochIndex(operator.index(index[0]), operator.index(index[1]))
        except TypeError:
            pass
    raise TypeError(
        f"a multi-epoch dataset is indexed by EpochIndex(epoch, idx), got {index!r}; "
        "wrap it in MultiEpochDatasetResampler to index it by a global sample number"
    )


@dataclass
class MultiEpochDatasetWrapper(Dataset[U_co], Generic[T, U_co], ABC):
    """Make an integer-indexed dataset multi-epoch by applying a per-epoch transform.

    ``wrapper[EpochIndex(e, i)] == apply_transform(dataset[i], EpochIndex(e, i))``. The
    underlying ``dataset[i]`` must be deterministic; any randomness belongs in
    :meth:`apply_transform`, drawn from a local generator seeded by ``(seed, e, i)``.

    Attributes:
        dataset: the underlying dataset (``dataset[i]`` for ``0 <= i < len(dataset)``).
    """

    dataset: SizedDataset[T]

    @abstractmethod
    def apply_transform(self, sample: T, index: EpochIndex) -> U_co:
        """Return the transformed ``sample`` for ``index`` (deterministic per ``index``)."""

    def __getitem__(self, index: EpochIndex) -> U_co:
        """Return ``apply_transform(dataset[index.idx], index)``.

        Raises:
            TypeError: ``index`` is not an ``EpochIndex`` / ``(epoch, idx)`` pair.
            IndexError: ``index.idx`` or ``index.epoch`` is out of range.
        """
        key = as_epoch_index(index)
        if not 0 <= key.idx < len(self.dataset):
            raise IndexError(
                f"idx {key.idx} out of range for a dataset of {len(self.dataset)} items"
            )
        if key.epoch < 0:
            raise IndexError(f"epoch must be >= 0, got {key.epoch}")
        return self.apply_transform(self.dataset[key.idx], key)

    def __len__(self) -> int:
        """Return ``len(dataset)``."""
        return len(self.dataset)

    def sample_identity(self, index: EpochIndex) -> dict[str, Any]:
        """The underlying item's ``sample_identity(index.idx)``, else ``{"index": index.idx}``."""
        idx = as_epoch_index(index).idx
        inner = getattr(self.dataset, "sample_identity", None)
        return inner(idx) if inner is not None else {"index": idx}


class IdentityMultiEpochDatasetWrapper(MultiEpochDatasetWrapper[T, T]):
    """A :class:`MultiEpochDatasetWrapper` that returns ``dataset[idx]`` unchanged in every epoch."""

    def apply_transform(self, sample: T, index: EpochIndex) -> T:
        """Return ``sample`` unchanged."""
        del index
        return sample
