"""The on-disk layout of Megatron's indexed dataset files (``.bin`` + ``.idx``).

A dataset at ``PREFIX`` is two files:

- ``PREFIX.bin``: every sequence's token ids, back to back, in one dtype, no header.
- ``PREFIX.idx``: a little-endian header then four arrays::

      offset  size  field
      0       9     magic  b"MMIDIDX\\x00\\x00"
      9       8     version, uint64, always 1
      17      1     dtype code, uint8 (see ``DTYPE_CODES``)
      18      8     sequence_count N, uint64
      26      8     document_count D, uint64 (= number of documents + 1)
      34      4*N   sequence_lengths, int32 (tokens per sequence)
      ...     8*N   sequence_pointers, int64 (byte offset of each sequence in .bin)
      ...     8*D   document_indices, int64 (0, then the sequence index ending each document)
      ...     1*N   sequence_modes, int8 (only in multimodal files)

This is byte for byte what Megatron-Core's ``IndexedDatasetBuilder`` writes and its
``IndexedDataset`` reads (``megatron/core/datasets/indexed_dataset.py``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
HEADER_SIZE = 34  # 9 magic + 8 version + 1 dtype code + 8 sequence count + 8 document count

# Megatron-Core's DType enum: code -> numpy dtype.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
CODE_OF_DTYPE: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPE_CODES.items()}

# Megatron switches from uint16 to int32 at this vocabulary size (not at 65536).
UINT16_VOCAB_LIMIT = 65500

PathLike = str | os.PathLike


class IndexedFileError(ValueError):
    """An indexed ``.bin``/``.idx`` pair is malformed; the message names the file."""


def get_idx_path(path_prefix: PathLike) -> str:
    """Return the index file path of a dataset prefix (``PREFIX.idx``)."""
    return os.fspath(path_prefix) + ".idx"


def get_bin_path(path_prefix: PathLike) -> str:
    """Return the data file path of a dataset prefix (``PREFIX.bin``)."""
    return os.fspath(path_prefix) + ".bin"


def exists(path_prefix: PathLike) -> bool:
    """Return whether both ``PREFIX.idx`` and ``PREFIX.bin`` exist as files."""
    return Path(get_idx_path(path_prefix)).is_file() and Path(get_bin_path(path_prefix)).is_file()


def normalize_dtype(dtype: object) -> np.dtype:
    """Return ``dtype`` as a ``np.dtype`` supported by the format.

    Args:
        dtype: a numpy scalar type (``np.uint16``), ``np.dtype`` or name (``"uint16"``).

    Raises:
        ValueError: the dtype has no Megatron dtype code.
    """
    try:
        resolved = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError as exc:
        raise ValueError(f"dtype {dtype!r} is not a numpy dtype") from exc
    resolved = resolved.newbyteorder("=") if resolved.byteorder == ">" else resolved
    if resolved not in CODE_OF_DTYPE:
        allowed = ", ".join(str(d) for d in DTYPE_CODES.values())
        raise ValueError(
            f"dtype {resolved} is not supported by the indexed format (allowed: {allowed})"
        )
    return resolved


def optimal_dtype(vocab_size: int | None) -> np.dtype:
    """Return the smallest token dtype Megatron uses for a vocabulary.

    Args:
        vocab_size: number of token ids (ids are ``0 .. vocab_size - 1``); ``None`` = unknown.

    Returns:
        ``uint16`` when ``vocab_size < 65500`` (Megatron's threshold), else ``int32``.
    """
    if vocab_size is not None and vocab_size < UINT16_VOCAB_LIMIT:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


@dataclass(frozen=True)
class IndexHeader:
    """The fixed-size header of an ``.idx`` file.

    Attributes:
        dtype: token dtype of the ``.bin`` file.
        sequence_count: number of sequences N.
        document_count: length of ``document_indices`` (number of documents + 1).
    """

    dtype: np.dtype
    sequence_count: int
    document_count: int

    def pack(self) -> bytes:
        """Return the 34 header bytes."""
        return (
            INDEX_MAGIC
            + struct.pack("<Q", INDEX_VERSION)
            + struct.pack("<B", CODE_OF_DTYPE[self.dtype])
            + struct.pack("<Q", self.sequence_count)
            + struct.pack("<Q", self.document_count)
        )

    def index_size(self, multimodal: bool) -> int:
        """Return the exact size in bytes of an ``.idx`` file with this header."""
        n, d = self.sequence_count, self.document_count
        return HEADER_SIZE + 4 * n + 8 * n + 8 * d + (n if multimodal else 0)


def read_header(idx_path: PathLike) -> IndexHeader:
    """Read and check the header of an ``.idx`` file.

    Raises:
        FileNotFoundError: the file does not exist.
        IndexedFileError: wrong magic, unknown version or dtype code, or fewer than 34 bytes.
    """
    idx_path = os.fspath(idx_path)
    with open(idx_path, "rb") as stream:
        raw = stream.read(HEADER_SIZE)
    if raw[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        if len(raw) < len(INDEX_MAGIC) and INDEX_MAGIC.startswith(raw):
            raise IndexedFileError(
                f"{idx_path}: truncated index file ({len(raw)} bytes, header needs {HEADER_SIZE})"
            )
        raise IndexedFileError(
            f"{idx_path}: not a Megatron indexed dataset index (magic {raw[:9]!r}, expected {INDEX_MAGIC!r})"
        )
    if len(raw) < HEADER_SIZE:
        raise IndexedFileError(
            f"{idx_path}: truncated index file ({len(raw)} bytes, header needs {HEADER_SIZE})"
        )
    (version,) = struct.unpack_from("<Q", raw, 9)
    if version != INDEX_VERSION:
        raise IndexedFileError(
            f"{idx_path}: unsupported index version {version} (only version {INDEX_VERSION})"
        )
    (code,) = struct.unpack_from("<B", raw, 17)
    if code not in DTYPE_CODES:
        raise IndexedFileError(
            f"{idx_path}: unknown dtype code {code} (known: {sorted(DTYPE_CODES)})"
        )
    sequence_count, document_count = struct.unpack_from("<QQ", raw, 18)
    return IndexHeader(DTYPE_CODES[code], int(sequence_count), int(document_count))
