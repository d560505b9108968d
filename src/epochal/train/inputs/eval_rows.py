"""A validation table evaluated whole: every row exactly once, in every layout.

The trainer's validation loader (Megatron's in-order sampler, drop-last) reads
whole global batches, and each global batch is split the same way over
data-parallel ranks and micro-batches whatever the layout. A fine-tuning table
rarely has a multiple of ``global_batch_size`` rows, so :class:`WholeTableRows`
completes the last global batch with *filler* samples: copies of the first row
(same keys, shapes and dtypes, so batches collate, pack and run like real ones)
whose targets mark them as not scored:

- integer ``labels`` (classification, per sequence or per residue) are ``-100``,
  the ignore index every head step already leaves out of its loss and accuracy;
- floating ``labels`` (regression) are NaN, which the regression step leaves out
  of its loss, MSE and correlations (a real target is always finite: the table
  reader refuses others);
- ``loss_mask`` is zero.

So an evaluation over ``len(dataset)`` samples sees each row once, and the head
steps' metrics (sums divided at the end) are those of exactly the table's rows.
Evaluation callbacks (``training.eval_callback``) see the filler samples too; their
labels mark them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["IGNORE_INDEX", "WholeTableRows", "filler_of"]

#: The ignore index of the classification heads' targets.
IGNORE_INDEX = -100


def filler_of(sample: dict[str, Any]) -> dict[str, Any]:
    """An unscored copy of ``sample`` (see the module docstring)."""
    out = dict(sample)
    labels = sample.get("labels")
    if isinstance(labels, torch.Tensor):
        value = math.nan if labels.is_floating_point() else IGNORE_INDEX
        out["labels"] = torch.full_like(labels, value)
    mask = sample.get("loss_mask")
    if isinstance(mask, torch.Tensor):
        out["loss_mask"] = torch.zeros_like(mask)
    return out


class WholeTableRows:
    """The rows of a map-style dataset, padded with unscored filler to a multiple of ``multiple``.

    Args:
        dataset: the validation rows (``len`` and integer indexing; items are dicts
            of tensors with ``labels``).
        multiple: the global batch size (>= 1).

    Raises:
        ValueError: an empty dataset or ``multiple < 1``.
    """

    def __init__(self, dataset: Any, multiple: int) -> None:
        if multiple < 1:
            raise ValueError(f"multiple must be >= 1, got {multiple}")
        self.dataset = dataset
        self.rows = len(dataset)
        if self.rows == 0:
            raise ValueError("a validation table needs at least one row")
        self.length = -(-self.rows // multiple) * multiple

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = int(index)
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range [0, {self.length})")
        if index < self.rows:
            return self.dataset[index]
        return filler_of(self.dataset[0])

    def __repr__(self) -> str:
        return f"WholeTableRows({self.rows} rows padded to {self.length})"
