"""``epochal demo-epochs``: show per-epoch shuffles and masks, and that they are reproducible.

A character-level tokenization of a real text (by default the opening of Dickens's
*A Tale of Two Cities*, public domain; or ``--text-file``) is cut into sequences,
wrapped in :class:`~epochal.data.masking.MaskedTokenDataset` and
:class:`~epochal.data.multi_epoch.MultiEpochDatasetResampler`, and every sample of
every epoch is printed: the order of the sequences and each masked sequence (``_`` is
the mask token, ``^`` marks the tokens the loss is computed on). The run is then
rebuilt from scratch and compared by digest, and checked to be a permutation per
epoch; the exit status is 1 if a check fails.
"""

from __future__ import annotations

import argparse
import sys

from epochal._text import plural
from epochal.data.epochs.demo import (
    DEFAULT_TEXT,
    MASK_CHAR,
    CharTokenizer,
    build_demo,
    check_demo,
    read_text,
)
from epochal.data.epochs.epoch_index import EpochIndex

__all__ = ["DEFAULT_TEXT", "CharTokenizer", "add_arguments", "build_demo", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``epochal demo-epochs``."""
    parser.add_argument(
        "--epochs", type=int, default=3, help="number of epochs to show (default 3)"
    )
    parser.add_argument(
        "--num-sequences", type=int, default=4, help="sequences per epoch (default 4)"
    )
    parser.add_argument(
        "--seq-len", type=int, default=40, help="characters per sequence (default 40)"
    )
    parser.add_argument(
        "--seed", type=int, default=42, help="seed of shuffles and masks (default 42)"
    )
    parser.add_argument(
        "--mask-prob", type=float, default=0.15, help="fraction of tokens selected (default 0.15)"
    )
    parser.add_argument(
        "--text-file", default=None, help="UTF-8 text to use instead of the built-in one"
    )


def run(args: argparse.Namespace) -> int:
    """Print every sample of every epoch, then the reproducibility checks; return the exit status."""
    try:
        text = DEFAULT_TEXT if args.text_file is None else read_text(args.text_file)
        options = dict(
            num_sequences=args.num_sequences,
            seq_len=args.seq_len,
            epochs=args.epochs,
            seed=args.seed,
            mask_prob=args.mask_prob,
        )
        tokenizer, sequences, resampler = build_demo(text, **options)
    except (OSError, ValueError) as err:
        print(f"epochal demo-epochs: error: {err}", file=sys.stderr)
        return 2
    n = len(sequences)
    print(
        f"{plural(n, 'sequence')} x {plural(args.epochs, 'epoch')}, seed {args.seed}; "
        f"masked-LM: {args.mask_prob:.0%} of "
        f"tokens selected (80% -> '{MASK_CHAR}', 10% random, 10% kept); '^' = in the loss"
    )
    for i, seq in enumerate(sequences):
        print(f"  item {i}: |{tokenizer.decode(seq)}|")
    checks = check_demo(text, **options)
    for epoch, order in enumerate(checks.orders):
        print(f"epoch {epoch}: order {order}")
        for g in range(epoch * n, (epoch + 1) * n):
            key: EpochIndex = resampler.epoch_index(g)
            sample = resampler[g]
            marks = "".join("^" if m else " " for m in sample["loss_mask"].tolist())
            prefix = f"  sample {g:>3} = item {key.idx}: "
            print(f"{prefix}|{tokenizer.decode(sample['tokens'].tolist())}|")
            print(f"{' ' * len(prefix)}|{marks}|")
    same = checks.rebuilt == checks.digest
    print(f"check: every epoch visits every item once: {'yes' if checks.permutations else 'NO'}")
    print(f"check: distinct orders among {args.epochs} epochs: {checks.distinct_orders}")
    print(f"check: items whose mask changes across epochs: {checks.changed} of {n}")
    print(
        f"check: rebuilt from scratch with seed {args.seed}: digest {checks.rebuilt} "
        f"{'== ' if same else '!= '}{checks.digest} (reproducible: {'yes' if same else 'NO'})"
    )
    print(
        f"check: seed {checks.other_seed} gives a different run: digest {checks.other} "
        f"({'yes' if checks.other != checks.digest else 'NO'})"
    )
    print("OK: samples are a pure function of (seed, sample number)" if checks.ok else "FAILED")
    return 0 if checks.ok else 1
