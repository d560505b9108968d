"""The ``EpochIndex`` key and the dataset protocols of multi-epoch training.

Megatron-LM asks a dataset for sample ``g`` of the run (``0 <= g < num_samples``)
and expects every model-parallel rank to get exactly the same sample for the
same ``g``. A multi-epoch dataset is keyed instead by ``EpochIndex(epoch, idx)``:
``idx`` names the underlying item and ``epoch`` lets the dataset apply a
different (but reproducible) random transform, such as a mask, every epoch.
:class:`~epochal.data.multi_epoch.MultiEpochDatasetResampler` maps ``g`` to an
``EpochIndex``. Semantics follow BioNeMo's ``bionemo.core.data.multi_epoch_dataset``.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

__all__ = ["EpochIndex", "MultiEpochDataset", "SizedDataset"]

T_co = TypeVar("T_co", covariant=True)


class EpochIndex(NamedTuple):
    """The key of a multi-epoch dataset: which item, and in which epoch it is drawn.

    Attributes:
        epoch: the epoch number, ``>= 0``.
        idx: the index of the item in the underlying dataset, ``0 <= idx < len(dataset)``.
    """

    epoch: int
    idx: int


@runtime_checkable
class SizedDataset(Protocol[T_co]):
    """An integer-indexed dataset of fixed length (``dataset[i]`` for ``0 <= i < len(dataset)``)."""

    def __getitem__(self, index: int, /) -> T_co: ...

    def __len__(self) -> int: ...


@runtime_checkable
class MultiEpochDataset(Protocol[T_co]):
    """A dataset indexed by :class:`EpochIndex`, for multi-epoch training under Megatron.

    ``len(dataset)`` is the number of distinct items (one epoch); ``dataset[EpochIndex(e, i)]``
    must return exactly the same value every time it is called with the same key, in any
    process, whatever the global random state (use a local generator seeded from
    ``(seed, e, i)``; never ``torch.manual_seed`` or the module-level random functions).
    """

    def __getitem__(self, index: EpochIndex, /) -> T_co: ...

    def __len__(self) -> int: ...
