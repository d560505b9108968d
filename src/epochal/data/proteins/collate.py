"""Batching ESM-2 samples of different lengths: BioNeMo's padding collate functions.

Semantics of bionemo-llm's ``padding_collate_fn`` / ``bert_padding_collate_fn``
(``bionemo/llm/data/collate.py``), which BioNeMo's ESM-2 data module uses with
``min_length = max_length = max_seq_length`` (every batch padded to the full length):

- each padded field is cut to ``max_length`` (if given), right-padded to the longest
  sample, then padded to ``min_length`` (if given; a ``min_length`` below the
  longest sample *cuts* the batch to it, as BioNeMo's negative ``F.pad`` does);
- padding values: ``text`` the pad id, ``labels`` -100, ``types``/``is_random`` 0,
  ``attention_mask``/``loss_mask`` 0/False; other keys are stacked unpadded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from epochal.data.epochs.masking import IGNORE_INDEX

__all__ = ["bert_padding_collate_fn", "padding_collate_fn"]


def padding_collate_fn(
    batch: Sequence[Mapping[str, torch.Tensor]],
    padding_values: Mapping[str, int | bool],
    min_length: int | None = None,
    max_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Stack samples of 1-D tensors into ``(batch, length)`` tensors, padding the named fields.

    Args:
        batch: samples with the same keys (an empty batch gives ``{}``).
        padding_values: field -> its padding value; other fields are stacked as they are.
        min_length: pad (or cut) every padded field to exactly this length.
        max_length: cut every sample's padded fields to at most this length first.

    Returns:
        field -> tensor of shape ``(len(batch), length)``.

    Raises:
        ValueError: the samples' keys differ (lists them).
    """
    if not batch:
        return {}
    keys = set(batch[0])
    if any(set(sample) != keys for sample in batch):
        raise ValueError(
            f"All keys in inputs must match each other. Got: {[sorted(s) for s in batch]}"
        )

    def pad(tensors: list[torch.Tensor], value: int | bool) -> torch.Tensor:
        if max_length is not None:
            tensors = [t[:max_length] for t in tensors]
        length = max(len(t) for t in tensors) if min_length is None else min_length
        out = torch.full((len(tensors), length), value, dtype=tensors[0].dtype)
        for row, tensor in enumerate(tensors):
            out[row, : len(tensor)] = tensor[:length]
        return out

    collated = {}
    for key in batch[0]:
        column = [sample[key] for sample in batch]
        collated[key] = (
            pad(column, padding_values[key]) if key in padding_values else torch.stack(column)
        )
    return collated


def bert_padding_collate_fn(
    batch: Sequence[Mapping[str, torch.Tensor]],
    padding_value: int,
    min_length: int | None = None,
    max_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """Collate :class:`~epochal.data.proteins.esm_dataset.ESMMaskedResidueDataset` samples.

    Args:
        batch: samples with ``text, types, attention_mask, labels, loss_mask, is_random``.
        padding_value: the pad id for ``text`` (ESM-2: 1).
        min_length / max_length: see :func:`padding_collate_fn` (BioNeMo's ESM-2 uses
            ``max_seq_length`` for both).

    Returns:
        The six fields as ``(len(batch), length)`` tensors (labels padded with -100).
    """
    values = {
        "text": padding_value,
        "types": 0,
        "attention_mask": False,
        "labels": IGNORE_INDEX,
        "loss_mask": False,
        "is_random": 0,
    }
    return padding_collate_fn(batch, values, min_length, max_length)
