"""Tiny deterministic data for trainer tests: a token dataset (no files) and a prose corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch


class CountingDataset:
    """Sample ``i``: an arithmetic sequence mod ``vocab`` (learnable), a pure function of ``i``.

    Items are Megatron GPT-style dicts: ``tokens``/``labels`` int64 ``[seq]``,
    ``loss_mask`` float ``[seq]``, ``position_ids`` int64 ``[seq]``.
    """

    def __init__(self, num_samples: int, seq_length: int, vocab: int, offset: int = 0) -> None:
        self.n, self.seq, self.vocab, self.offset = num_samples, seq_length, vocab, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        i = int(i) + self.offset
        start = (i * 7919) % self.vocab
        step = 1 + (i % 3)
        seq = (start + step * torch.arange(self.seq + 1)) % self.vocab
        return {
            "tokens": seq[:-1].clone(),
            "labels": seq[1:].clone(),
            "loss_mask": torch.ones(self.seq),
            "position_ids": torch.arange(self.seq),
        }


PROSE_WORDS = (
    "the cat dog sat on a mat and ran to house with big small red blue tree under over".split()
)


def write_prose_jsonl(path: Path, *, seed: int = 0, num_docs: int = 300) -> Path:
    """A fixed JSONL corpus (``{"text": ...}`` per line) of ``num_docs`` documents of 2-6 sentences.

    For tests of the sentence-split presets (``bert-tiny``, ``t5-tiny``): their default
    corpus, the Python standard library, differs between Python versions, and a
    small slice of it can leave a split without any usable document.
    """
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(num_docs):
            sentences = [
                " ".join(rng.choice(PROSE_WORDS) for _ in range(rng.randint(4, 9))).capitalize()
                + "."
                for _ in range(rng.randint(2, 6))
            ]
            f.write(json.dumps({"text": " ".join(sentences)}) + "\n")
    return path
