"""Resumable loading: Megatron samplers and WrappedDataLoader vs PyTorch's own sampler and loader.

Prints one table (best of ``--repeats`` runs, same process, same machine):

- index generation: micro-batches per second of one data-parallel rank's batch
  sampler over ``--samples`` samples (``micro_batch_size`` 8, data-parallel size 8):
  ours ``single``, ``cyclic`` (Megatron's per-rank buckets) and ``cyclic`` with
  ``global_shuffle`` (O(1)-memory permutation per micro-batch), against
  ``torch.utils.data.BatchSampler(RandomSampler(...), 8)``;
- loader: micro-batches per second through ``WrappedDataLoader`` (position counting,
  ``num_workers=0``) vs a plain ``DataLoader(batch_size=8)`` on the same in-memory
  dataset (one small tensor dict per sample);
- resume: time to the first micro-batch after resuming at sample ``--resume-at`` (all
  ranks): ours only sets ``consumed_samples``; a loader without that state has to
  fast-forward its sampler through the consumed micro-batches (measured over
  ``--samples`` samples and scaled, so that row is computed).

Run::

    python benchmarks/bench_loading.py            # ~30 s
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from epochal.data import (
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    WrappedDataLoader,
)

MBS, DP, GBS = 8, 8, 512


class Samples:
    """``n`` tiny GPT-like samples held in memory (the loader overhead dominates)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tokens = torch.arange(16, dtype=torch.int64)
        self.mask = torch.ones(16)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"tokens": self.tokens, "loss_mask": self.mask, "id": i}


def best_rate(fn, repeats: int) -> float:
    """Best items per second of ``repeats`` calls of ``fn`` (which returns its item count)."""
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = fn()
        best = max(best, count / (time.perf_counter() - t0))
    return best


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def count(iterable) -> int:
    n = 0
    for _ in iterable:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--samples", type=int, default=2_000_000, help="dataset size for index generation"
    )
    parser.add_argument(
        "--loader-samples", type=int, default=200_000, help="dataset size for the loader rows"
    )
    parser.add_argument(
        "--resume-at", type=int, default=10**9, help="resume position (samples, all ranks)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n, r = args.samples, args.repeats
    rows: list[tuple[str, str, str]] = []

    def sampler(kind: str, total: int, consumed: int = 0):
        if kind == "single":
            return MegatronPretrainingSampler(total, consumed, MBS, 3, DP)
        return MegatronPretrainingRandomSampler(
            total,
            consumed,
            MBS,
            3,
            DP,
            global_batch_size=GBS,
            global_shuffle=kind == "global",
            seed=1,
        )

    torch_rate = best_rate(lambda: count(BatchSampler(RandomSampler(range(n // DP)), MBS, True)), r)
    for kind, label in (
        ("single", "single"),
        ("bucket", "cyclic (Megatron buckets)"),
        ("global", "cyclic, global_shuffle"),
    ):
        rate = best_rate(lambda kind=kind: count(sampler(kind, n)), r)
        rows.append(
            (
                f"index generation, {label}",
                f"{rate / 1e3:9.1f} k mb/s",
                f"{torch_rate / 1e3:9.1f} k mb/s (BatchSampler(RandomSampler))",
            )
        )

    data = Samples(args.loader_samples)
    plain = best_rate(lambda: count(DataLoader(data, batch_size=MBS)), r)
    ours = best_rate(
        lambda: count(
            WrappedDataLoader(
                data,
                mode="train",
                batch_sampler=MegatronPretrainingSampler(len(data), 0, MBS, 0, 1),
            )
        ),
        r,
    )
    rows.append(
        (
            "loader, num_workers=0",
            f"{ours / 1e3:9.1f} k mb/s",
            f"{plain / 1e3:9.1f} k mb/s (DataLoader)",
        )
    )

    at = args.resume_at - args.resume_at % GBS
    epoch = n - n % GBS  # a dataset of n samples; the position lies in a later epoch
    skipped = at // (MBS * DP)  # micro-batches each rank would have to skip
    for kind, label in (
        ("global", "cyclic, global_shuffle"),
        ("bucket", "cyclic (Megatron buckets)"),
    ):
        seconds = best_time(lambda kind=kind: next(iter(sampler(kind, epoch, at))), r)
        rows.append(
            (
                f"resume at sample {at:.1e}, {label}",
                f"{seconds * 1e3:9.2f} ms",
                f"{skipped / torch_rate:9.1f} s (fast-forward {skipped:.1e} mb; computed)",
            )
        )

    width = max(len(a) for a, _, _ in rows)
    print(f"{'':{width}} | {'ours':>18} | reference")
    print(f"{'-' * width}-|-{'-' * 18}-|-{'-' * 40}")
    for a, b, c in rows:
        print(f"{a:{width}} | {b:>18} | {c}")


if __name__ == "__main__":
    main()
