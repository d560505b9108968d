"""``epochal inspect PREFIX``: counts, a length histogram and decoded samples of indexed files.

Opening validates the pair, so ``inspect`` is also a quick integrity check. Samples
are decoded when a tokenizer is given (same flags as ``preprocess``), else shown as ids.
Example::

    epochal inspect data/corpus_text_document --tokenizer-type gpt2 --samples 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from epochal.commands.preprocess import add_tokenizer_arguments, tokenizer_from_args
from epochal.data.indexed.indexed_dataset import IndexedDataset
from epochal.data.indexed.indexed_format import IndexedFileError
from epochal.data.indexed.tokenizer import TokenizerFileError

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``inspect`` flags."""
    parser.add_argument("prefix", help="dataset prefix (PREFIX.bin and PREFIX.idx)")
    parser.add_argument(
        "--samples", type=int, default=3, help="sequences to show, evenly spaced (default 3)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="tokens shown per sample (default 64)"
    )
    parser.add_argument(
        "--mode", choices=["mmap", "cached", "lazy"], default="mmap", help="read mode"
    )
    parser.add_argument(
        "--multimodal", action="store_true", help="the index carries per-sequence modes"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the statistics as one JSON object"
    )
    add_tokenizer_arguments(parser, required=False)


def run(args: argparse.Namespace) -> int:
    """Run ``epochal inspect``; returns 0, or 1 after printing the error."""
    try:
        tokenizer = tokenizer_from_args(args) if args.tokenizer_type else None
        dataset = IndexedDataset(args.prefix, mode=args.mode, multimodal=args.multimodal)
    except (IndexedFileError, TokenizerFileError, FileNotFoundError, ValueError) as exc:
        print(f"epochal inspect: error: {exc}", file=sys.stderr)
        return 1
    with dataset:
        stats = length_statistics(dataset.sequence_lengths)
        docs = dataset.document_indices
        empty_documents = int(np.count_nonzero(np.diff(docs) == 0)) if len(docs) > 1 else 0
        samples = []
        for i in sample_indices(len(dataset), args.samples):
            item = dataset[i]
            tokens = item[0] if args.multimodal else item
            shown = tokens[: args.max_tokens]
            samples.append(
                {
                    "index": i,
                    "length": int(tokens.size),
                    "text": tokenizer.decode(shown.tolist()) if tokenizer is not None else None,
                    "ids": shown.tolist(),
                }
            )
        info = {
            "prefix": args.prefix,
            "dtype": str(dataset.dtype),
            "sequences": len(dataset),
            "documents": dataset.document_count,
            "empty_documents": empty_documents,
            "tokens": dataset.num_tokens,
            "bin_bytes": os.path.getsize(dataset.bin_path),
            "idx_bytes": os.path.getsize(dataset.idx_path),
            "lengths": stats,
            "samples": samples,
        }
    if args.json:
        print(json.dumps(info))
        return 0
    _print_report(info, args.max_tokens)
    return 0


def _print_report(info: dict[str, Any], max_tokens: int) -> None:
    print(
        f"{info['prefix']}: {info['sequences']:,} sequences in {info['documents']:,} documents, "
        f"{info['tokens']:,} tokens ({info['dtype']}); .bin {info['bin_bytes']:,} bytes, .idx {info['idx_bytes']:,} bytes"
    )
    if info["empty_documents"]:
        print(f"documents without sequences: {info['empty_documents']:,}")
    stats = info["lengths"]
    if stats["min"] is None:
        return
    print(
        f"sequence length (tokens): min {stats['min']:,}, mean {stats['mean']:,.1f}, median {stats['median']:,.0f}, "
        f"p99 {stats['p99']:,.0f}, max {stats['max']:,}"
    )
    peak = max(count for _, _, count in stats["histogram"])
    width = len(f"{stats['histogram'][-1][1]:,}")
    for low, high, count in stats["histogram"]:
        bar = "#" * (round(40 * count / peak) if peak else 0)
        print(f"  [{low:>{width},}, {high:>{width},})  {bar:<40} {count:,}")
    for sample in info["samples"]:
        cut = "..." if sample["length"] > max_tokens else ""
        shown = (
            repr(sample["text"])
            if sample["text"] is not None
            else " ".join(map(str, sample["ids"]))
        )
        print(f"sequence {sample['index']:,} ({sample['length']:,} tokens): {shown}{cut}")
