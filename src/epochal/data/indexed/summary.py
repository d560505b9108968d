"""What ``epochal inspect`` reports about an indexed dataset: counts, a length histogram, samples."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from epochal.data.indexed.indexed_reader import IndexedDataset

__all__ = ["length_statistics", "sample_indices", "summarize_indexed"]

_QUANTILE_SAMPLE = 10_000_000  # above this many sequences, quantiles come from an even sample


def length_statistics(lengths: np.ndarray) -> dict[str, Any]:
    """Return min/mean/median/p99/max and a power-of-two histogram of sequence lengths.

    Args:
        lengths: int32 sequence lengths, shape ``(N,)``.

    Returns:
        ``{"min", "mean", "median", "p99", "max"}`` (``None`` when empty) and ``"histogram"``:
        a list of ``(low, high, count)`` buckets ``[0, 1), [1, 2), [2, 4), [4, 8), ...`` from the
        first to the last non-empty one.
    """
    n = len(lengths)
    if n == 0:
        return {
            "min": None,
            "mean": None,
            "median": None,
            "p99": None,
            "max": None,
            "histogram": [],
        }
    total, low, high = 0, None, None
    buckets = np.zeros(33, dtype=np.int64)
    for start in range(0, n, 1 << 22):
        chunk = lengths[start : start + (1 << 22)].astype(np.int64)
        total += int(chunk.sum())
        low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
        high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
        # bucket 0 holds length 0; bucket k >= 1 holds [2**(k-1), 2**k)
        positive = chunk[chunk > 0]
        buckets[0] += chunk.size - positive.size
        buckets += np.bincount(np.floor(np.log2(positive)).astype(np.int64) + 1, minlength=33)[:33]
    sample = lengths if n <= _QUANTILE_SAMPLE else lengths[:: n // _QUANTILE_SAMPLE]
    median, p99 = np.percentile(sample, [50, 99])
    used = np.flatnonzero(buckets)
    histogram = [
        (0 if k == 0 else 1 << (k - 1), 1 if k == 0 else 1 << k, int(buckets[k]))
        for k in range(int(used[0]), int(used[-1]) + 1)
    ]
    return {
        "min": low,
        "mean": total / n,
        "median": float(median),
        "p99": float(p99),
        "max": high,
        "histogram": histogram,
    }


def sample_indices(count: int, samples: int) -> list[int]:
    """Return ``samples`` evenly spaced sequence indices in ``[0, count)`` (first and last included)."""
    if count == 0 or samples <= 0:
        return []
    return sorted({int(i) for i in np.linspace(0, count - 1, num=min(samples, count)).round()})


def summarize_indexed(
    dataset: IndexedDataset, *, samples: int = 3, max_tokens: int = 64, tokenizer: Any = None
) -> dict[str, Any]:
    """Counts, file sizes, length statistics and evenly spaced samples of an open dataset.

    Args:
        dataset: the dataset (its ``path_prefix`` is reported as ``"prefix"``).
        samples: sequences to show, evenly spaced (first and last included).
        max_tokens: tokens kept per sample.
        tokenizer: decodes the samples' tokens into ``"text"`` (None: ``"text"`` is None).

    Returns:
        ``{"prefix", "dtype", "sequences", "documents", "empty_documents", "tokens",
        "bin_bytes", "idx_bytes", "lengths"`` (:func:`length_statistics`) ``, "samples"}``;
        each sample is ``{"index", "length", "text", "ids"}``.
    """
    stats = length_statistics(dataset.sequence_lengths)
    docs = dataset.document_indices
    empty_documents = int(np.count_nonzero(np.diff(docs) == 0)) if len(docs) > 1 else 0
    shown_samples = []
    for i in sample_indices(len(dataset), samples):
        item = dataset[i]
        tokens = item[0] if dataset.multimodal else item
        shown = tokens[:max_tokens]
        shown_samples.append(
            {
                "index": i,
                "length": int(tokens.size),
                "text": tokenizer.decode(shown.tolist()) if tokenizer is not None else None,
                "ids": shown.tolist(),
            }
        )
    info = {
        "prefix": dataset.path_prefix,
        "dtype": str(dataset.dtype),
        "sequences": len(dataset),
        "documents": dataset.document_count,
        "empty_documents": empty_documents,
        "tokens": dataset.num_tokens,
        "bin_bytes": os.path.getsize(dataset.bin_path),
        "idx_bytes": os.path.getsize(dataset.idx_path),
        "lengths": stats,
        "samples": shown_samples,
    }
    return info
