"""Packing fine-tuning rows: how full the samples are, and how long packing takes.

Row lengths (in tokens) follow a log-normal distribution (median ``--median``,
``--sigma``), the shape of chat and instruction data, cut at the sequence length as
``overlength="truncate"`` would. For each sequence length the table gives the samples
needed one row a sample (:class:`~epochal.data.sft.packing.SFTDataset`) and packed
(:class:`~epochal.data.sft.packing.PackedSFTDataset`, best-fit decreasing), the share
of real (non-padding) tokens of each (the packing efficiency), and the time
:func:`~epochal.data.sft.packing.best_fit_bins` takes. With ``--trl`` (``trl``
installed), TRL's ``pack_dataset(..., "bfd")`` packs the same rows too: its samples,
their real tokens and its time. TRL packs each ``datasets.map`` batch of 1,000 rows on
its own (the same samples as epochal's for up to 1,000 rows); epochal packs all rows
together.

    python benchmarks/bench_sft_packing.py                    # 100,000 rows, seconds
    python benchmarks/bench_sft_packing.py --rows 20000 --trl
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from epochal.data.sft.packing import best_fit_bins


def lengths_of(rows: int, median: float, sigma: float, cap: int, seed: int) -> list[int]:
    """Log-normal row lengths, at least 2 tokens, cut at ``cap``."""
    rng = np.random.default_rng(seed)
    values = np.exp(rng.normal(np.log(median), sigma, size=rows)).round().astype(np.int64)
    return np.clip(values, 2, cap).tolist()


def trl_bins(lengths: list[int], seq_length: int) -> tuple[float, int]:
    """TRL's bfd packing of rows of these lengths: seconds and samples."""
    import datasets
    from trl.data_utils import pack_dataset

    table = datasets.Dataset.from_dict({"input_ids": [[0] * n for n in lengths]})
    start = time.perf_counter()
    packed = pack_dataset(table, seq_length, "bfd")
    seconds = time.perf_counter() - start
    return seconds, len(packed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--median", type=float, default=350.0, help="median row length, tokens")
    parser.add_argument("--sigma", type=float, default=0.9, help="log-normal sigma")
    parser.add_argument("--seq-lengths", default="1024,2048,4096")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trl", action="store_true", help="also time TRL's bfd packing")
    args = parser.parse_args()
    print(f"{args.rows:,} rows, log-normal lengths (median {args.median:g}, sigma {args.sigma:g})")
    head = f"{'seq_length':>10} {'padded samples':>15} {'real %':>7} {'packed samples':>15} "
    head += f"{'real %':>7} {'pack s':>7}"
    if args.trl:
        head += f" {'TRL samples':>12} {'real %':>7} {'TRL s':>7}"
    print(head)
    for seq_length in (int(s) for s in args.seq_lengths.split(",")):
        lengths = lengths_of(args.rows, args.median, args.sigma, seq_length, args.seed)
        tokens = sum(lengths)
        start = time.perf_counter()
        bins = best_fit_bins(lengths, seq_length)
        seconds = time.perf_counter() - start
        line = (
            f"{seq_length:>10} {len(lengths):>15,} {100 * tokens / (len(lengths) * seq_length):>7.2f} "
            f"{len(bins):>15,} {100 * tokens / (len(bins) * seq_length):>7.2f} {seconds:>7.2f}"
        )
        if args.trl:
            trl_seconds, trl_samples = trl_bins(lengths, seq_length)
            trl_real = 100 * tokens / (trl_samples * seq_length)
            line += f" {trl_samples:>12,} {trl_real:>7.2f} {trl_seconds:>7.2f}"
        print(line)


if __name__ == "__main__":
    main()
