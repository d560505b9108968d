"""A blend source that grows by whole epochs without reordering the samples it already had.

Megatron's GPT dataset shuffles the samples of all its epochs together, so building a
corpus for more samples (more epochs) reorders its earlier samples too. A scheduled
blend may ask a source for more samples after a resume (its future weight grew), so
its sources are :class:`SourceEpochs`: the dataset a blend without a schedule builds
(``base``, Megatron's, sized as Megatron sizes it), followed by as many extra epochs as
the schedule needs, each one epoch of the corpus shuffled by its own seed
(:func:`epoch_seed`). Adding epochs never changes the samples before them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from epochal.data.epochs.epoch_index import EpochIndex

__all__ = ["SourceEpochs", "epoch_seed"]


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of extra epoch ``epoch`` (0-based) of a source of seed ``seed``.

    Below ``2**31 - 1``, the bound of the masked datasets' seeds (Megatron's C ``int``).
    """
    return (int(seed) + 0x9E3779B1 * (int(epoch) + 1)) % (2**31 - 1)


class SourceEpochs:
    """``base`` followed by extra epochs made by ``make_epoch(e)`` on demand (see module docstring).

    Args:
        base: the source as a blend without schedule builds it.
        make_epoch: builds extra epoch ``e`` (one epoch of the corpus); not pickled
            (extend before handing the dataset to worker processes).
        name: the source's name.
    """

    def __init__(self, base: Any, make_epoch: Callable[[int], Any] | None, name: str) -> None:
        self.base = base
        self.extra: list[Any] = []
        self.make_epoch = make_epoch
        self.name = name
        self._starts = [0, len(base)]

    @property
    def num_epochs(self) -> int:
        return int(getattr(self.base, "num_epochs", 1) or 1) + len(self.extra)

    def ensure(self, n: int) -> None:
        """Add extra epochs until the source holds ``n`` samples.

        Raises:
            ValueError: it needs more but cannot grow (an empty epoch, no ``make_epoch``).
        """
        while len(self) < n:
            if self.make_epoch is None:
                raise ValueError(f"source {self.name} needs {n} samples but has {len(self)}")
            epoch = self.make_epoch(len(self.extra))
            if len(epoch) == 0:
                raise ValueError(f"source {self.name} has no samples in an epoch")
            self.extra.append(epoch)
            self._starts.append(self._starts[-1] + len(epoch))

    def __len__(self) -> int:
        return self._starts[-1]

    def _part(self, idx: int | EpochIndex) -> tuple[int, int]:
        if isinstance(idx, EpochIndex):
            idx = idx.idx
        i = int(idx)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for source {self.name} of {len(self)}")
        part = bisect.bisect_right(self._starts, i) - 1
        return part, i - self._starts[part]

    def __getitem__(self, idx: int | EpochIndex) -> Any:
        part, j = self._part(idx)
        return (self.base if part == 0 else self.extra[part - 1])[j]

    def sample_identity(self, idx: int | EpochIndex) -> dict[str, Any]:
        """The base's identity; an extra epoch's says its epoch and seed."""
        part, j = self._part(idx)
        if part == 0:
            inner = getattr(self.base, "sample_identity", None)
            return inner(j) if inner is not None else {"index": j}
        epoch = self.extra[part - 1]
        inner = getattr(epoch, "sample_identity", None)
        identity = inner(j) if inner is not None else {"index": j}
        base_epochs = int(getattr(self.base, "num_epochs", 1) or 1)
        return {**identity, "epoch": base_epochs + part - 1, "extra_epoch": part - 1}

    def epoch_of(self, n: int) -> int:
        """The epoch of the source's sample ``n`` (0-based; the base's epochs counted evenly)."""
        if n < len(self.base):
            epochs = int(getattr(self.base, "num_epochs", 1) or 1)
            return n // max(1, len(self.base) // epochs)
        part = min(bisect.bisect_right(self._starts, n) - 1, len(self._starts) - 2)
        return int(getattr(self.base, "num_epochs", 1) or 1) + part - 1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "make_epoch": None}

    def __repr__(self) -> str:
        return f"SourceEpochs({self.name}, {len(self)} samples, {self.num_epochs} epochs)"
