"""Random-access reads of indexed (.bin/.idx) files: ours in each mode vs Megatron-Core.

Writes one dataset (``--sequences`` sequences of 1..``--max-length`` uint16 tokens,
lengths uniform, fixed seed) with our builder, then times, in the same run and on the
same files, random reads of whole sequences (``ds[i]``) and of windows
(``ds.get(i, offset, length)``, what a GPT dataset does) through:

- ours: ``IndexedDataset(prefix, mode="mmap" | "cached" | "lazy")``;
- reference: Megatron-Core's ``IndexedDataset(prefix, mmap=True | False)``.

Each figure is the best of ``--repeats`` passes over the same ``--reads`` random
indices, after one warm-up pass (the files are in the page cache: this measures the
per-read overhead, not the disk). Also times opening the dataset (ours validates every
pointer on open). Run::

    python benchmarks/bench_indexed_reads.py            # ~1 minute
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import numpy as np

from epochal.data import IndexedDataset, IndexedDatasetBuilder
from epochal.data.indexed.indexed_format import get_bin_path


def best_time(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call, in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def build(prefix: str, sequences: int, max_length: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_length + 1, size=sequences)
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint16)
    tokens = rng.integers(0, 50257, size=int(lengths.sum()), dtype=np.uint16)
    builder.add_documents(tokens, lengths, np.ones(sequences, dtype=np.int64))
    builder.finalize()
    return lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=200_000)
    parser.add_argument(
        "--max-length", type=int, default=1024, help="tokens; lengths are uniform in 1..max"
    )
    parser.add_argument("--reads", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexedDataset

    with tempfile.TemporaryDirectory() as tmp:
        prefix = f"{tmp}/bench"
        lengths = build(prefix, args.sequences, args.max_length, args.seed)
        rng = np.random.default_rng(args.seed + 1)
        indices = rng.integers(0, args.sequences, size=args.reads).tolist()
        offsets = [int(rng.integers(0, lengths[i])) for i in indices]
        windows = [min(int(lengths[i]) - o, 128) for i, o in zip(indices, offsets)]
        print(
            f"dataset: {args.sequences:,} sequences, {int(lengths.sum()):,} uint16 tokens "
            f"({lengths.sum() * 2 / 2**20:.0f} MiB); {args.reads:,} random reads, best of {args.repeats}"
        )

        candidates = [
            ("ours mmap", lambda: IndexedDataset(prefix, mode="mmap")),
            ("ours cached", lambda: IndexedDataset(prefix, mode="cached")),
            ("ours lazy (pread)", lambda: IndexedDataset(prefix, mode="lazy")),
            ("Megatron-Core mmap=True", lambda: MegatronIndexedDataset(prefix, mmap=True)),
            ("Megatron-Core mmap=False", lambda: MegatronIndexedDataset(prefix, mmap=False)),
        ]
        print(
            f"\n{'reader':<26} {'open':>9} {'ds[i] reads/s':>15} {'get(i, off, 128) reads/s':>26}"
        )
        for name, opener in candidates:
            start = time.perf_counter()
            ds = opener()
            opened = time.perf_counter() - start

            def whole(ds=ds) -> None:
                for i in indices:
                    ds[i]

            def window(ds=ds) -> None:
                for i, o, n in zip(indices, offsets, windows):
                    ds.get(i, o, n)

            t_whole = best_time(whole, args.repeats)
            t_window = best_time(window, args.repeats)
            print(
                f"{name:<26} {opened * 1e3:7.1f}ms {args.reads / t_whole:15,.0f} {args.reads / t_window:26,.0f}"
            )
            del ds


if __name__ == "__main__":
    main()
