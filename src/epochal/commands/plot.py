"""``epochal plot RUN_DIR``: write the run's loss curves (train, validation, resumed segments) to PNG.

``--mix``: instead, the realised mix of a blended run (each source's share per step,
from the ledger in ``metrics.jsonl``; :mod:`epochal.train.observe.mix_plot`).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``RUN_DIR``, ``--output`` and ``--smooth``."""
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("-o", "--output", default=None, help="PNG path (default RUN_DIR/loss.png)")
    parser.add_argument(
        "--smooth", type=int, default=0, help="running-mean window for train loss (0 = auto)"
    )
    parser.add_argument(
        "--mix",
        action="store_true",
        help="plot a blended run's realised mix per step instead (default RUN_DIR/mix.png)",
    )


def run(args: argparse.Namespace) -> int:
    """Plot and print the PNG's path; exit status 1 with a message if the run has no metrics."""
    from epochal.train.observe.plot import plot_run

    try:
        if args.output:  # the PNG may sit in the run directory, never on its metrics
            from pathlib import Path

            from epochal._paths import check_output_apart

            check_output_apart(
                Path(args.run_dir) / "metrics.jsonl",
                args.output,
                source_name="the metrics",
                output_name="--output",
            )
        if args.mix:
            from epochal.train.observe.mix_plot import plot_mix

            out = plot_mix(args.run_dir, args.output, smooth=args.smooth)
        else:
            out = plot_run(args.run_dir, args.output, smooth=args.smooth)
    except (FileNotFoundError, ValueError) as exc:
        print(f"epochal plot: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
