"""A mock corpus for GPT tests and demos, equal to Megatron-Core's ``MockGPTLowLevelDataset``.

Document ``i`` has ``sequence_lengths[i]`` tokens (drawn once from
``numpy.random.default_rng(seed)`` in ``[1, max_sequence_length)``): the ids
``1, 2, ..., length - 1`` (modulo ``vocab_size``) followed by the end-of-document id.
No files are needed; with the defaults the documents are exactly Megatron-Core's
mock documents, so a ``GPTDataset`` over it equals Megatron's ``MockGPTDataset``.
"""

from __future__ import annotations

import numpy as np


class MockGPTLowLevelDataset:
    """Synthetic documents with Megatron's ``IndexedDataset`` interface.

    Args:
        vocab_size: ids are taken modulo this (>= 2).
        eod_token_id: id appended to every document.
        num_documents: number of documents (Megatron: 100000).
        max_sequence_length: lengths are drawn in ``[1, max_sequence_length)`` (Megatron: 4096).
        seed: seed of the length draw (Megatron: 0).

    Attributes:
        sequence_lengths: int32 ``[num_documents]``.
        document_indices: int64 ``[num_documents + 1]`` (one sequence per document).
        dtype: ``np.int64``, the dtype of returned tokens.
        path_prefix: ``None`` (no files).

    Raises:
        ValueError: an argument out of range.
    """

    def __init__(
        self,
        vocab_size: int,
        eod_token_id: int,
        num_documents: int = 100_000,
        max_sequence_length: int = 4096,
        seed: int = 0,
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if num_documents < 1:
            raise ValueError(f"num_documents must be >= 1, got {num_documents}")
        if max_sequence_length < 2:
            raise ValueError(f"max_sequence_length must be >= 2, got {max_sequence_length}")
        self.vocab_size = int(vocab_size)
        self.eod_token_id = int(eod_token_id)
        self.path_prefix = None
        self.dtype = np.dtype(np.int64)
        rng = np.random.default_rng(seed=seed)
        self.sequence_lengths = rng.integers(
            1, max_sequence_length, size=num_documents, dtype=np.int32
        )
        self.document_indices = np.arange(num_documents + 1, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.sequence_lengths.shape[0])

    def __getitem__(self, idx: int) -> np.ndarray:
        """Return document ``idx``: int64 ``[sequence_lengths[idx]]``."""
        length = int(self.sequence_lengths[idx])
        tokens = np.empty(length, dtype=np.int64)
        tokens[:-1] = (np.arange(length - 1) + 1) % self.vocab_size
        tokens[-1] = self.eod_token_id
        return tokens

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Return tokens ``[offset, offset + length)`` of document ``idx`` (``None`` = to the end).

        Raises:
            IndexError: ``idx`` out of range or the span outside the document.
        """
        n = len(self)
        if not -n <= int(idx) < n:
            raise IndexError(f"mock document {idx} out of range [0, {n})")
        size = int(self.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"get({idx}, offset={offset}, length={length}) is outside mock document of length {size}"
            )
        return self[idx][offset : offset + length]
