"""Open time of an indexed dataset with full validation (cold and remembered) vs Megatron-Core.

For each size in ``--documents`` (default 1M and 10M one-sequence documents of
1..``--max-length`` uint16 tokens, fixed seed), writes one ``.bin``/``.idx`` pair with
our builder, waits until the files are old enough to be remembered (2 s, see
:mod:`epochal.data.indexed.indexed_validation`), then times, in the same run and on
the same files (in the page cache), ``IndexedDataset(prefix)`` (mmap) opened:

- validated, cold: the O(N) check runs (nothing remembered);
- validated, remembered on disk: a new process's first open with the index cache
  folder (the record in the folder is read, no scan);
- validated, remembered in process: a later open in the same process;
- ``validate=False``: O(1) checks only;
- reference: Megatron-Core 0.16.1's ``IndexedDataset(prefix, mmap=True)``.

Each figure is the best of ``--repeats`` opens after one warm-up open. Run::

    python benchmarks/bench_validate.py            # ~1 minute, ~400 MB in a temp folder
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import numpy as np

from epochal.data import IndexedDataset, IndexedDatasetBuilder
from epochal.data.indexed import indexed_validation
from epochal.data.indexed.indexed_format import get_bin_path


def best_time(fn, repeats: int, before=lambda: None) -> float:
    """Best wall time of ``repeats`` calls (``before`` runs untimed before each), in seconds."""
    before()
    fn()
    best = float("inf")
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def build(prefix: str, documents: int, max_length: int, seed: int) -> int:
    """Write ``documents`` one-sequence documents; return the token count."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_length + 1, size=documents)
    tokens = rng.integers(0, 50257, size=int(lengths.sum()), dtype=np.uint16)
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint16)
    builder.add_documents(tokens, lengths, np.ones(documents, dtype=np.int64))
    builder.finalize()
    return int(lengths.sum())


def measure(count: int, args: argparse.Namespace, megatron_cls) -> dict[str, float]:
    """Build a ``count``-document pair and return ``{open kind: best seconds}``."""
    forget = indexed_validation._VALIDATED.clear
    with tempfile.TemporaryDirectory() as tmp:
        prefix, cache = f"{tmp}/bench", f"{tmp}/cache"
        build(prefix, count, args.max_length, args.seed)
        time.sleep(indexed_validation.SETTLE_NS / 1e9 + 0.1)  # old enough to be remembered
        forget()
        IndexedDataset(prefix, validation_cache=cache)  # writes the record
        return {
            "validated, cold": best_time(lambda: IndexedDataset(prefix), args.repeats, forget),
            "validated, remembered on disk": best_time(
                lambda: IndexedDataset(prefix, validation_cache=cache), args.repeats, forget
            ),
            "validated, remembered in process": best_time(
                lambda: IndexedDataset(prefix), args.repeats
            ),
            "validate=False": best_time(
                lambda: IndexedDataset(prefix, validate=False), args.repeats
            ),
            "Megatron-Core mmap=True": best_time(
                lambda: megatron_cls(prefix, mmap=True), args.repeats
            ),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--max-length", type=int, default=8, help="tokens per document, 1..max")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronIndexedDataset

    rows = [(count, measure(count, args, MegatronIndexedDataset)) for count in args.documents]

    print(f"best of {args.repeats} opens, files in the page cache")
    print("| documents | open | time |")
    print("|---:|---|---:|")
    for count, times in rows:
        for name, seconds in times.items():
            print(f"| {count:,} | {name} | {seconds * 1e3:.2f} ms |")


if __name__ == "__main__":
    main()
