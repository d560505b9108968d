"""Megatron-Core's train/valid/test split strings and document ranges.

``"969,30,1"`` is normalized to fractions, turned into cumulative book-ends
``[(0, 0.969), (0.969, 0.999), (0.999, 1.0)]`` (a zero-width split becomes
``None``), and each book-end into the document range
``[round(beg * N), round(end * N))`` of a corpus of ``N`` documents, with the same
float operations and Python's ``round`` as Megatron-Core
(``blended_megatron_dataset_config.py`` and ``blended_megatron_dataset_builder.py``),
so the ranges are identical. This is Megatron-Core's formula, not the legacy
Megatron-LM one (which rounded the split sizes and shifted the remainder).

Unlike Megatron-Core, which extracts numbers with a regular expression (so
``"-1,2"`` silently becomes ``"1,2"``), an invalid split string raises ``ValueError``.
"""

from __future__ import annotations

import math

import numpy as np

SPLIT_NAMES = ("train", "valid", "test")


def parse_split(split: str) -> list[float]:
    """Parse ``"969,30,1"`` (or ``/``-separated) into three normalized fractions.

    Missing trailing parts are 0 (``"99,1"`` is ``"99,1,0"``).

    Args:
        split: one to three non-negative numbers separated by ``,`` or ``/``.

    Returns:
        ``[train, valid, test]`` fractions summing to 1 (float64 normalization as Megatron).

    Raises:
        ValueError: if the string is not 1-3 finite non-negative numbers with a positive sum.
    """
    if not isinstance(split, str):
        raise ValueError(f"split must be a string like '969,30,1', got {type(split).__name__}")
    parts = [p.strip() for p in split.replace("/", ",").split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"split {split!r} must be 1-3 comma-separated numbers like '969,30,1'"
        ) from None
    if not 1 <= len(values) <= 3:
        raise ValueError(
            f"split {split!r} must have 1 to 3 parts (train, valid, test), got {len(values)}"
        )
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"split {split!r} must contain finite non-negative numbers")
    if sum(values) <= 0:
        raise ValueError(f"split {split!r} must have a positive sum")
    values += [0.0] * (3 - len(values))
    weights = np.array(values, dtype=np.float64)
    return (weights / np.sum(weights)).tolist()


def split_matrix(fractions: list[float]) -> list[tuple[float, float] | None]:
    """Turn split fractions into Megatron's book-ends; a zero-width split is ``None``.

    Example: ``[0.99, 0.01, 0.0] -> [(0, 0.99), (0.99, 1.0), None]``.
    """
    ends = [0.0]
    for value in fractions:
        ends.append(ends[-1] + value)
    matrix: list[tuple[float, float] | None] = []
    for beg, end in zip(ends[:-1], ends[1:]):
        matrix.append(None if end <= beg else (beg, end))
    return matrix


def split_document_ranges(
    split: str | list[float], num_documents: int
) -> list[tuple[int, int] | None]:
    """Return the ``[begin, end)`` document range of each split, or ``None`` for an absent split.

    Args:
        split: a split string, or already-normalized fractions.
        num_documents: documents in the corpus (``>= 0``).

    Returns:
        Three entries (train, valid, test). A present split may still be empty
        (``begin == end``) when the corpus is small; the dataset then raises.
    """
    if (
        isinstance(num_documents, bool)
        or not isinstance(num_documents, int | np.integer)
        or num_documents < 0
    ):
        raise ValueError(f"num_documents must be an int >= 0, got {num_documents!r}")
    fractions = parse_split(split) if isinstance(split, str) else list(split)
    ranges: list[tuple[int, int] | None] = []
    for bookend in split_matrix(fractions):
        if bookend is None:
            ranges.append(None)
        else:
            ranges.append(
                (
                    int(round(bookend[0] * float(num_documents))),
                    int(round(bookend[1] * float(num_documents))),
                )
            )
    return ranges
