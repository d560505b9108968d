"""The padding sentinel of the Megatron samplers and the dataset view that resolves it.

NeMo pads an incomplete last global batch with the indices ``-1, -2, ...``; a
dataset that accepts negative indices (a list, a numpy array, most user
datasets) then silently returns real samples from the end of the data, which are
trained on and counted twice. epochal's samplers never hand a dataset a negative
index: they pad with :data:`PAD`, an instance of :class:`PaddingIndex` that is not
an integer, so a dataset used without :class:`PaddedDataset` fails loudly with a
``TypeError`` instead of returning wrong data.

:class:`PaddedDataset` (installed by :class:`~epochal.data.loader.WrappedDataLoader`)
turns every :data:`PAD` into a *fully loss-masked* sample: a real sample's
structure (same keys, shapes and dtypes) with every value zeroed, ``loss_mask``
included, so the padded positions contribute nothing to the loss and the batch
still collates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "PAD",
    "PaddedDataset",
    "PaddingError",
    "PaddingIndex",
    "is_padding",
    "zeros_like_sample",
]

LOSS_MASK_KEY = "loss_mask"


class PaddingError(ValueError):
    """A padded sample cannot be built from the dataset's samples (the message says why)."""


@dataclass(frozen=True)
class PaddingIndex:
    """The index the samplers emit for a padding position (never a negative integer).

    All instances compare equal; use :data:`PAD` or :func:`is_padding`. Picklable, so it
    travels to DataLoader worker processes.
    """

    def __repr__(self) -> str:
        return "PAD"


PAD = PaddingIndex()
"""The padding sentinel."""


def is_padding(index: Any) -> bool:
    """Whether ``index`` is the padding sentinel."""
    return isinstance(index, PaddingIndex)


def zeros_like_sample(sample: Any, *, require_loss_mask: bool = True) -> Any:
    """Return a sample with the structure of ``sample`` and every value zeroed.

    Tensors and numpy arrays become zeros of the same shape, dtype (and device);
    numbers become ``0`` of the same type, strings ``""``; mappings, lists and tuples
    (named tuples included) are rebuilt recursively; ``None`` stays ``None``.

    Args:
        sample: a real sample, e.g. a dict of tensors ``tokens``, ``labels``,
            ``loss_mask``, ``position_ids``.
        require_loss_mask: require ``sample`` to be a mapping with a ``"loss_mask"``
            entry, so that the padded sample is excluded from the loss.

    Returns:
        The zeroed sample.

    Raises:
        PaddingError: ``require_loss_mask`` and the sample has no ``loss_mask``, or a
            value of a type that cannot be zeroed.
    """
    if require_loss_mask and not (isinstance(sample, Mapping) and LOSS_MASK_KEY in sample):
        keys = sorted(sample) if isinstance(sample, Mapping) else type(sample).__name__
        raise PaddingError(
            f"cannot pad: padded samples must be excluded from the loss, so samples must be "
            f"mappings with a {LOSS_MASK_KEY!r} entry (got {keys}); use drop_last=True or add a loss mask"
        )
    return _zeros(sample, "sample")


def _zeros(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, np.ndarray):
        return np.zeros_like(value)
    if isinstance(value, np.generic):
        return value.dtype.type(0)
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float | complex):
        return type(value)(0)
    if isinstance(value, str):
        return ""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return type(value)({k: _zeros(v, f"{where}[{k!r}]") for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # named tuple
        return type(value)(*(_zeros(v, f"{where}.{f}") for f, v in zip(value._fields, value)))
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return type(value)(_zeros(v, f"{where}[{i}]") for i, v in enumerate(value))
    raise PaddingError(
        f"cannot build a padded sample: {where} has unsupported type {type(value).__name__}"
    )


class PaddedDataset:
    """A read-only view of a map-style dataset that resolves :data:`PAD` indices.

    ``view[i]`` is ``dataset[i]`` for every real index; ``view[PAD]`` is
    :func:`zeros_like_sample` of a template sample. In a batched fetch
    (``__getitems__``, which the DataLoader uses) the template is the first real
    sample of the same micro-batch, else ``dataset[template_index]``; so a padded
    micro-batch costs no extra read unless it is all padding.

    Args:
        dataset: the dataset (``__getitem__``; ``__len__`` and ``__getitems__`` used if present).
        template_index: index of the sample whose structure all-padding micro-batches copy.
    """

    def __init__(self, dataset: Any, template_index: int = 0) -> None:
        if isinstance(dataset, PaddedDataset):
            dataset = dataset.dataset
        self.dataset = dataset
        self.template_index = template_index

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        if is_padding(index):
            return zeros_like_sample(self.dataset[self.template_index])
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[Any]) -> list[Any]:
        indices = list(indices)
        real = [i for i in indices if not is_padding(i)]
        inner_getitems = getattr(self.dataset, "__getitems__", None)
        if inner_getitems is not None:
            real_samples = list(inner_getitems(real)) if real else []
        else:
            real_samples = [self.dataset[i] for i in real]
        if len(real) == len(indices):
            return real_samples
        template = real_samples[0] if real_samples else self.dataset[self.template_index]
        pad = zeros_like_sample(template)
        it = iter(real_samples)
        # Each padding position gets its own zero sample object (collate may mutate in place).
        return [(zeros_like_sample(pad) if is_padding(i) else next(it)) for i in indices]

    def __getattr__(self, name: str) -> Any:
        # Delegate everything else (e.g. a dataset's collate_fn or config) to the wrapped dataset.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"PaddedDataset({self.dataset!r})"
