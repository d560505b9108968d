"""Small datasets shared by the resumable-loading tests (module level, so workers can pickle them)."""

from __future__ import annotations

import torch

SEQ_LEN = 6
VOCAB = 50


class ToyGPTDataset:
    """GPT-shaped samples that are a pure function of the index.

    ``ds[i]`` is a dict of ``id`` (int64 scalar), ``tokens``/``labels``/``position_ids``
    (int64 ``[SEQ_LEN]``), ``loss_mask`` (float32 ``[SEQ_LEN]``, all ones) and ``x``
    (float32 ``[4]`` features for tiny models). Negative or non-integer indices raise.
    """

    def __init__(self, length: int, seed: int = 0) -> None:
        self.length = length
        self.seed = seed
        self.calls: list = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"ToyGPTDataset index must be an int, got {index!r}")
        if not 0 <= index < self.length:
            raise IndexError(f"ToyGPTDataset index {index} out of range [0, {self.length})")
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(0, VOCAB, (SEQ_LEN + 1,), generator=g)
        return {
            "id": torch.tensor(index, dtype=torch.int64),
            "tokens": tokens[:-1].clone(),
            "labels": tokens[1:].clone(),
            "loss_mask": torch.ones(SEQ_LEN, dtype=torch.float32),
            "position_ids": torch.arange(SEQ_LEN, dtype=torch.int64),
            "x": torch.randn(4, generator=g),
        }


class NegativeIndexFriendlyList(list):
    """A list dataset: ``ds[-1]`` silently returns the last element (the NeMo padding bug's victim)."""


def ids_of(batch) -> list[int]:
    """Sample ids of a collated micro-batch (padding has id 0 and loss_mask 0)."""
    return batch["id"].tolist()
