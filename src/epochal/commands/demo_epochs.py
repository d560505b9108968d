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
import hashlib
import sys
from collections.abc import Sequence

import numpy as np

from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.masking import MaskedTokenDataset
from epochal.data.epochs.multi_epoch import MultiEpochDatasetResampler
from epochal.data.epochs.permutation import MAX_SEED

__all__ = ["DEFAULT_TEXT", "CharTokenizer", "add_arguments", "build_demo", "run"]

DEFAULT_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, "
    "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
    "incredulity, it was the season of Light, it was the season of Darkness, it was "
    "the spring of hope, it was the winter of despair, we had everything before us, "
    "we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way"
)
"""Charles Dickens, *A Tale of Two Cities* (1859), opening sentence (public domain)."""

MASK_ID = 0
MASK_CHAR = "_"


class CharTokenizer:
    """Character-level tokenizer: id 0 is the mask token, the text's characters follow (sorted).

    Args:
        text: the text whose characters form the vocabulary.
    """

    def __init__(self, text: str):
        """Build the vocabulary from the distinct characters of ``text``."""
        self.chars = sorted(set(text))
        self.ids = {c: i + 1 for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        """Number of ids, the mask token included."""
        return len(self.chars) + 1

    def encode(self, text: str) -> list[int]:
        """Return the ids of the characters of ``text`` (each must be in the vocabulary)."""
        return [self.ids[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of ``ids``; the mask token shows as ``_``."""
        return "".join(MASK_CHAR if i == MASK_ID else self.chars[i - 1] for i in ids)


def build_demo(
    text: str, *, num_sequences: int, seq_len: int, epochs: int, seed: int, mask_prob: float
) -> tuple[CharTokenizer, list[list[int]], MultiEpochDatasetResampler]:
    """Tokenize ``text``, cut it into sequences and wrap them for multi-epoch masked training.

    Returns:
        ``(tokenizer, sequences, resampler)``; ``len(resampler) == num_sequences * epochs``.

    Raises:
        ValueError: an option is out of range or the text is shorter than
            ``num_sequences * seq_len`` characters.
    """
    for name, value in (
        ("--num-sequences", num_sequences),
        ("--seq-len", seq_len),
        ("--epochs", epochs),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not 0.0 <= mask_prob <= 1.0:
        raise ValueError(f"--mask-prob must be in [0, 1], got {mask_prob}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--seed must be in [0, 2**64), got {seed}")
    text = " ".join(text.split())  # one line: newlines and tabs become spaces
    need = num_sequences * seq_len
    if len(text) < need:
        raise ValueError(
            f"the text has {len(text)} characters; --num-sequences x --seq-len needs {need}"
        )
    tokenizer = CharTokenizer(text)
    sequences = [
        tokenizer.encode(text[i * seq_len : (i + 1) * seq_len]) for i in range(num_sequences)
    ]
    masked = MaskedTokenDataset(
        sequences,
        mask_token_id=MASK_ID,
        random_tokens=range(1, tokenizer.vocab_size),
        mask_prob=mask_prob,
        seed=seed,
    )
    return tokenizer, sequences, MultiEpochDatasetResampler(masked, num_epochs=epochs, seed=seed)


def _digest(resampler: MultiEpochDatasetResampler) -> str:
    h = hashlib.sha256()
    for g in range(len(resampler)):
        key = resampler.epoch_index(g)
        sample = resampler[g]
        h.update(np.asarray(key, dtype=np.int64).tobytes())
        for name in ("tokens", "labels", "loss_mask"):
            h.update(sample[name].numpy().tobytes())
    return h.hexdigest()[:16]


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


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def run(args: argparse.Namespace) -> int:
    """Print every sample of every epoch, then the reproducibility checks; return the exit status."""
    try:
        text = DEFAULT_TEXT if args.text_file is None else _read_text(args.text_file)
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
        f"{n} sequences x {args.epochs} epochs, seed {args.seed}; masked-LM: {args.mask_prob:.0%} of "
        f"tokens selected (80% -> '{MASK_CHAR}', 10% random, 10% kept); '^' = in the loss"
    )
    for i, seq in enumerate(sequences):
        print(f"  item {i}: |{tokenizer.decode(seq)}|")
    orders = []
    for epoch in range(args.epochs):
        epochs_arr, idx = resampler.epoch_indices(epoch * n, (epoch + 1) * n)
        orders.append(idx.tolist())
        print(f"epoch {epoch}: order {idx.tolist()}")
        for g in range(epoch * n, (epoch + 1) * n):
            key: EpochIndex = resampler.epoch_index(g)
            sample = resampler[g]
            marks = "".join("^" if m else " " for m in sample["loss_mask"].tolist())
            prefix = f"  sample {g:>3} = item {key.idx}: "
            print(f"{prefix}|{tokenizer.decode(sample['tokens'].tolist())}|")
            print(f"{' ' * len(prefix)}|{marks}|")
    other_seed = (args.seed + 1) % (MAX_SEED + 1)
    digest = _digest(resampler)
    rebuilt = _digest(build_demo(text, **options)[2])
    other = _digest(build_demo(text, **{**options, "seed": other_seed})[2])
    permutations = all(sorted(order) == list(range(n)) for order in orders)
    distinct_orders = len({tuple(o) for o in orders})
    masked = resampler.dataset
    changed = sum(
        any(
            not masked[EpochIndex(0, i)]["loss_mask"].equal(masked[EpochIndex(e, i)]["loss_mask"])
            for e in range(1, args.epochs)
        )
        for i in range(n)
    )
    ok = digest == rebuilt and permutations and digest != other
    print(f"check: every epoch visits every item once: {'yes' if permutations else 'NO'}")
    print(f"check: distinct orders among {args.epochs} epochs: {distinct_orders}")
    print(f"check: items whose mask changes across epochs: {changed} of {n}")
    print(
        f"check: rebuilt from scratch with seed {args.seed}: digest {rebuilt} "
        f"{'== ' if rebuilt == digest else '!= '}{digest} (reproducible: {'yes' if rebuilt == digest else 'NO'})"
    )
    print(
        f"check: seed {other_seed} gives a different run: digest {other} "
        f"({'yes' if other != digest else 'NO'})"
    )
    print("OK: samples are a pure function of (seed, sample number)" if ok else "FAILED")
    return 0 if ok else 1
