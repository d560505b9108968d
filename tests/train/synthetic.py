"""A tiny deterministic token dataset for trainer tests (no files, no tokenizer)."""

from __future__ import annotations

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
