"""Small corpora and a reference loop for the GPT dataset tests (not a test module)."""

from __future__ import annotations

import os

import numpy as np

EOD = 0
VOCAB = 1000


def random_documents(
    seed: int, count: int, max_length: int = 50, min_length: int = 1
) -> list[np.ndarray]:
    """``count`` documents of random ids in ``[1, VOCAB)``, each ending with ``EOD``."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(count):
        n = int(rng.integers(min_length, max_length + 1))
        tokens = rng.integers(1, VOCAB, size=n).astype(np.int64)
        tokens[-1] = EOD
        docs.append(tokens)
    return docs


def write_ours(directory: str, name: str, docs: list[np.ndarray], dtype=np.uint16) -> str:
    """Write ``docs`` with epochal's builder; return the prefix."""
    from epochal.data.indexed.indexed_dataset import write_indexed_dataset

    return write_indexed_dataset(os.path.join(directory, name), docs, dtype=dtype)


def write_megatron(directory: str, name: str, docs: list[np.ndarray], dtype=np.uint16) -> str:
    """Write ``docs`` with Megatron-Core's builder; return the prefix."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = os.path.join(directory, name)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(np.asarray(doc, dtype=np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


class ArrayCorpus:
    """In-memory corpus with the IndexedDataset interface (for pure unit tests)."""

    def __init__(self, docs: list[np.ndarray]) -> None:
        self.docs = [np.asarray(d, dtype=np.int64) for d in docs]
        self.sequence_lengths = np.array([len(d) for d in docs], dtype=np.int32)
        self.path_prefix = "array-corpus"

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        doc = self.docs[idx]
        if length is None:
            length = len(doc) - offset
        assert 0 <= offset and offset + length <= len(doc), (idx, offset, length)
        return doc[offset : offset + length]


def reference_sample_index(
    sizes, document_index, seq_length, num_epochs, tokens_per_epoch, drop_last, extra
):
    """A line-by-line Python port of Megatron's helpers.cpp ``build_sample_idx`` loop."""
    extra = int(extra)
    if drop_last:
        num_samples = (num_epochs * tokens_per_epoch - extra) // seq_length
    else:
        num_samples = int(
            np.ceil(np.float32(num_epochs * tokens_per_epoch - extra) / np.float32(seq_length))
        )
    out = [(0, 0)]
    doc_i, offset = 0, 0
    while len(out) <= num_samples:
        remaining = seq_length + extra
        while remaining != 0:
            length = int(sizes[document_index[doc_i]]) - offset
            remaining -= length
            if remaining <= 0:
                offset += remaining + length - extra
                remaining = 0
            else:
                if doc_i == len(document_index) - 1:
                    offset = int(sizes[document_index[doc_i]]) - extra
                    break
                doc_i += 1
                offset = 0
        out.append((doc_i, offset))
    return np.array(out, dtype=np.int64)
