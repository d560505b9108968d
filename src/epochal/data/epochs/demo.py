"""The per-epoch demo behind ``epochal demo-epochs``: shuffles and masks that change every epoch, reproducibly.

A character-level tokenization of a real text (by default the opening of Dickens's
*A Tale of Two Cities*, public domain) is cut into sequences, wrapped in
:class:`~epochal.data.epochs.masking.MaskedTokenDataset` and
:class:`~epochal.data.epochs.multi_epoch.MultiEpochDatasetResampler`
(:func:`build_demo`); :func:`check_demo` rebuilds the run from scratch and compares
digests, checks that every epoch is a permutation and that another seed differs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.masking import MaskedTokenDataset
from epochal.data.epochs.multi_epoch import MultiEpochDatasetResampler
from epochal.data.epochs.permutation import MAX_SEED

__all__ = [
    "DEFAULT_TEXT",
    "CharTokenizer",
    "DemoChecks",
    "build_demo",
    "check_demo",
    "demo_digest",
    "read_text",
]

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


def demo_digest(resampler: MultiEpochDatasetResampler) -> str:
    """A short SHA-256 of every sample of ``resampler`` (keys, tokens, labels, loss masks)."""
    h = hashlib.sha256()
    for g in range(len(resampler)):
        key = resampler.epoch_index(g)
        sample = resampler[g]
        h.update(np.asarray(key, dtype=np.int64).tobytes())
        for name in ("tokens", "labels", "loss_mask"):
            h.update(sample[name].numpy().tobytes())
    return h.hexdigest()[:16]


def read_text(path: str) -> str:
    """The UTF-8 text of ``path``.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not UTF-8 (naming the file and byte).
    """
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


@dataclass(frozen=True)
class DemoChecks:
    """What :func:`check_demo` found.

    Attributes:
        orders: per epoch, the order of the sequences (item numbers).
        permutations: every epoch visits every item once.
        distinct_orders: number of different orders among the epochs.
        changed: items whose loss mask differs in some epoch from epoch 0.
        digest: digest of the run; ``rebuilt``: of the same run built again.
        other_seed / other: the next seed and the digest of its run.
        ok: reproducible, permutations, and the other seed differs.
    """

    orders: list[list[int]]
    permutations: bool
    distinct_orders: int
    changed: int
    digest: str
    rebuilt: str
    other_seed: int
    other: str
    ok: bool


def check_demo(
    text: str, *, num_sequences: int, seq_len: int, epochs: int, seed: int, mask_prob: float
) -> DemoChecks:
    """Build the demo of :func:`build_demo` (same arguments) and check that it is reproducible.

    Raises:
        ValueError: as :func:`build_demo`.
    """
    options = dict(
        num_sequences=num_sequences, seq_len=seq_len, epochs=epochs, seed=seed, mask_prob=mask_prob
    )
    _, sequences, resampler = build_demo(text, **options)
    n = len(sequences)
    orders = [
        resampler.epoch_indices(epoch * n, (epoch + 1) * n)[1].tolist() for epoch in range(epochs)
    ]
    other_seed = (seed + 1) % (MAX_SEED + 1)
    digest = demo_digest(resampler)
    rebuilt = demo_digest(build_demo(text, **options)[2])
    other = demo_digest(build_demo(text, **{**options, "seed": other_seed})[2])
    permutations = all(sorted(order) == list(range(n)) for order in orders)
    masked = resampler.dataset
    changed = sum(
        any(
            not masked[EpochIndex(0, i)]["loss_mask"].equal(masked[EpochIndex(e, i)]["loss_mask"])
            for e in range(1, epochs)
        )
        for i in range(n)
    )
    return DemoChecks(
        orders=orders,
        permutations=permutations,
        distinct_orders=len({tuple(o) for o in orders}),
        changed=changed,
        digest=digest,
        rebuilt=rebuilt,
        other_seed=other_seed,
        other=other,
        ok=digest == rebuilt and permutations and digest != other,
    )
