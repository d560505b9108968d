"""Index mapping: MultiEpochDatasetResampler (O(1) Feistel permutation) vs materialized permutations.

Maps global sample numbers of a ``--dataset-size`` x ``--epochs`` run (default
10**7 x 100 = 10**9 samples) to ``(epoch, idx)`` and prints one table:

- ours: ``MultiEpochDatasetResampler.epoch_index`` (scalar), ``epoch_indices``
  (contiguous range, vectorized) and ``map_indices`` (random global indices,
  vectorized); "sequential" scalar access is what Megatron's sequential sampler does;
- reference: the straightforward approach, one ``np.random.default_rng((seed,
  epoch)).permutation(dataset_size)`` materialized per epoch, then looked up.

Memory is measured with ``tracemalloc`` (numpy reports its buffers to it). The
reference's whole-run figure is computed as epochs x the measured one-epoch
permutation (materializing 8 GB is not attempted); its random-access figures use the
two epochs it has materialized. Run::

    python benchmarks/bench_epoch_index.py            # ~1 minute
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np

from epochal.data import EpochIndex, MultiEpochDatasetResampler


class Keys:
    """A multi-epoch dataset of ``n`` items that returns its key (only the mapping is timed)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: EpochIndex) -> EpochIndex:
        return index


def best_time(fn, repeats: int) -> float:
    """Best wall time of ``repeats`` calls, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def traced_peak(fn) -> tuple[object, int]:
    """Return ``(fn(), peak traced bytes during the call)``."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return out, peak


def fmt_rate(count: int, seconds: float) -> str:
    rate = count / seconds
    return f"{rate / 1e6:8.2f} M/s" if rate >= 1e6 else f"{rate / 1e3:8.1f} k/s"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset-size", type=int, default=10**7)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument(
        "--scalar-count", type=int, default=100_000, help="indices per scalar timing"
    )
    parser.add_argument(
        "--vector-count", type=int, default=1_000_000, help="indices per vector timing"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    n, epochs, seed = args.dataset_size, args.epochs, args.seed
    total = n * epochs
    rng = np.random.default_rng(0)

    # ---- ours
    resampler, ours_build_mem = traced_peak(
        lambda: MultiEpochDatasetResampler(Keys(n), num_epochs=epochs, seed=seed)
    )
    ours_build = best_time(
        lambda: MultiEpochDatasetResampler(Keys(n), num_epochs=epochs, seed=seed), 3
    )
    scalar_g = rng.integers(0, total, size=args.scalar_count).tolist()
    ours_scalar = best_time(lambda: [resampler.epoch_index(g) for g in scalar_g], args.repeats)
    seq_g = range(n // 2, n // 2 + args.scalar_count)
    ours_seq = best_time(lambda: [resampler.epoch_index(g) for g in seq_g], args.repeats)
    start = (epochs // 2) * n - args.vector_count // 2  # a range that crosses an epoch boundary
    ours_range = best_time(
        lambda: resampler.epoch_indices(start, start + args.vector_count), args.repeats
    )
    random_g = rng.integers(0, total, size=args.vector_count)
    ours_random = best_time(lambda: resampler.map_indices(random_g), args.repeats)
    _, ours_map_mem = traced_peak(lambda: resampler.epoch_index(total - 1))
    _, ours_vec_mem = traced_peak(lambda: resampler.epoch_indices(start, start + args.vector_count))

    # ---- reference: one materialized permutation per epoch
    def ref_epoch(e: int) -> np.ndarray:
        return np.random.default_rng((seed, e)).permutation(n)

    perm0, ref_epoch_mem = traced_peak(lambda: ref_epoch(0))
    ref_build_epoch = best_time(lambda: ref_epoch(0), max(1, args.repeats - 1))
    perms = np.stack([perm0, ref_epoch(1)])  # the reference holds two epochs for the lookups
    del perm0
    local_scalar = rng.integers(0, 2 * n, size=args.scalar_count).tolist()

    def ref_scalar_lookup() -> list[EpochIndex]:
        out = []
        for g in local_scalar:
            e, i = divmod(g, n)
            out.append(EpochIndex(e, int(perms[e, i])))
        return out

    ref_scalar = best_time(ref_scalar_lookup, args.repeats)

    def ref_seq_lookup() -> list[EpochIndex]:
        out = []
        for g in seq_g:
            e, i = divmod(g, n)
            out.append(EpochIndex(e, int(perms[e, i])))
        return out

    ref_seq = best_time(ref_seq_lookup, args.repeats)
    ref_start = n - args.vector_count // 2  # crosses the boundary between the held epochs

    def ref_range() -> tuple[np.ndarray, np.ndarray]:
        stop, pos, epochs_out, idx_out = ref_start + args.vector_count, ref_start, [], []
        while pos < stop:
            e, off = divmod(pos, n)
            seg = min(stop, (e + 1) * n)
            epochs_out.append(np.full(seg - pos, e, dtype=np.int64))
            idx_out.append(perms[e, off : off + seg - pos])
            pos = seg
        return np.concatenate(epochs_out), np.concatenate(idx_out)

    ref_range_t = best_time(ref_range, args.repeats)
    _, ref_vec_mem = traced_peak(ref_range)
    local_random = rng.integers(0, 2 * n, size=args.vector_count)

    def ref_random() -> tuple[np.ndarray, np.ndarray]:
        e, i = np.divmod(local_random, n)
        return e, perms[e, i]

    ref_random_t = best_time(ref_random, args.repeats)
    ref_run_mem = ref_epoch_mem * epochs

    rows = [
        (
            "construct (whole run)",
            f"{ours_build * 1e6:.0f} us",
            f"{ref_build_epoch * epochs:.1f} s ({ref_build_epoch:.2f} s/epoch x {epochs})",
        ),
        (
            "scalar, sequential g",
            fmt_rate(args.scalar_count, ours_seq),
            fmt_rate(args.scalar_count, ref_seq),
        ),
        (
            "scalar, random g",
            fmt_rate(args.scalar_count, ours_scalar),
            fmt_rate(args.scalar_count, ref_scalar) + " (2 epochs held)",
        ),
        (
            "vector, contiguous range",
            fmt_rate(args.vector_count, ours_range),
            fmt_rate(args.vector_count, ref_range_t),
        ),
        (
            "vector, random global idx",
            fmt_rate(args.vector_count, ours_random),
            fmt_rate(args.vector_count, ref_random_t) + " (2 epochs held)",
        ),
        ("memory: construct", fmt_bytes(ours_build_mem), fmt_bytes(ref_epoch_mem) + " per epoch"),
        (
            f"memory: whole run ({total:.0e} samples)",
            fmt_bytes(max(ours_build_mem, ours_map_mem)),
            f"{fmt_bytes(ref_run_mem)} (computed: {epochs} x measured epoch)",
        ),
        (
            f"memory: map {args.vector_count:.0e} at once",
            fmt_bytes(ours_vec_mem),
            fmt_bytes(ref_vec_mem) + " + the held epochs",
        ),
    ]
    print(
        f"dataset {n:.0e} items x {epochs} epochs = {total:.0e} samples; seed {seed}; "
        f"numpy {np.__version__}"
    )
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows + [("", "ours (Feistel resampler)")])
    print(
        f"| {'':{w0}} | {'ours (Feistel resampler)':{w1}} | reference (np.random.permutation per epoch) |"
    )
    print(f"|{'-' * (w0 + 2)}|{'-' * (w1 + 2)}|{'-' * 45}|")
    for name, ours, ref in rows:
        print(f"| {name:{w0}} | {ours:{w1}} | {ref} |")


if __name__ == "__main__":
    main()
