"""Megatron's indexed dataset (``.bin`` + ``.idx``): reader and builder.

Files written here are read by Megatron-Core's ``IndexedDataset`` and files it
writes are read here, sequence for sequence (see :mod:`epochal.data.indexed.indexed_format`
for the layout). Differences from Megatron-Core, all on the side of safety:

- Opening validates the pair (magic, version, dtype code, sizes, every pointer and
  document boundary) and raises :class:`IndexedFileError` naming the file, where
  Megatron asserts or returns wrong tokens.
- ``mode="lazy"`` reads with ``pread`` (no mmap) and ``mode="cached"`` holds both
  files in memory; Megatron has only mmap or per-read ``open``.
- The builder writes to temporary names and renames on :meth:`IndexedDatasetBuilder.finalize`,
  keeps its index in bounded memory (spilling to disk) and rejects token ids that
  do not fit its dtype instead of wrapping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from epochal._atomic import fsync_dir
from epochal.data.indexed.indexed_format import (
    HEADER_SIZE,
    IndexedFileError,
    IndexHeader,
    PathLike,
    exists,
    get_bin_path,
    get_idx_path,
    normalize_dtype,
    optimal_dtype,
    read_header,
)
from epochal.data.indexed.indexed_readers import READERS, map_file
from epochal.data.indexed.indexed_validation import (
    check_index_arrays,
    file_identity,
    is_remembered,
    remember,
)
from epochal.data.indexed.spill_array import CHUNK, SpillArray, SpillArrayView, temp_name

__all__ = [
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "IndexedFileError",
    "exists",
    "get_bin_path",
    "get_idx_path",
    "merge_indexed_datasets",
    "optimal_dtype",
    "write_indexed_dataset",
]


class IndexedDataset:
    """Random access to the sequences of a Megatron ``.bin``/``.idx`` pair.

    Args:
        path_prefix: path without extension; reads ``PREFIX.idx`` and ``PREFIX.bin``.
        mode: ``"mmap"`` maps both files (default, zero-copy); ``"cached"`` reads both
            into memory; ``"lazy"`` reads the index into memory and the tokens with
            ``pread`` calls (no mmap).
        multimodal: the index carries one int8 mode per sequence (Megatron's
            multimodal files); ``ds[i]`` then returns ``(tokens, mode)``.
        validate: check every length, pointer and document boundary on open (O(N),
            vectorized in cache-sized chunks, a few ms per million sequences).
            A pair that passed is remembered by file identity (path, size, inode,
            mtime, ctime) in this process and in ``validation_cache``, so reopening
            unchanged files skips the scan; a changed file, or one changed in the last
            2 s, is checked again (see :mod:`epochal.data.indexed.indexed_validation`).
            ``False`` keeps the O(1) checks only (header, file sizes, first and last
            boundaries); every read is still bounds-checked.
        validation_cache: folder for the validation records (the GPT builder passes its
            index cache); ``None`` remembers in this process only.
        mmap: Megatron-Core's argument, accepted for drop-in use: ``True`` means
            ``mode="mmap"``, ``False`` means ``mode="lazy"``; overrides ``mode``.

    Attributes:
        path_prefix: the prefix given.
        mode: the read mode.
        dtype: token dtype (``np.dtype``), e.g. ``np.dtype("uint16")``.
        sequence_lengths: int32 array, shape ``(N,)``: tokens per sequence.
        sequence_pointers: int64 array, shape ``(N,)``: byte offset of each sequence in ``.bin``.
        document_indices: int64 array, shape ``(D + 1,)``: starts with 0; entry ``k + 1`` is
            one past the last sequence of document ``k`` (Megatron's semantics).
        sequence_modes: int8 array ``(N,)`` for multimodal files, else ``None``.

    Raises:
        FileNotFoundError: ``PREFIX.idx`` or ``PREFIX.bin`` is missing.
        IndexedFileError: the files are malformed or do not match each other (the message
            names the file).
        ValueError: an unknown ``mode``.

    Returned token arrays are views into the file or cache in ``mmap``/``cached`` mode
    (read-only; copy before modifying) and fresh arrays in ``lazy`` mode.
    Pickling stores only the prefix and options; the copy reopens the files (without
    re-validating), so datasets can be sent to ``DataLoader`` workers.
    """

    def __init__(
        self,
        path_prefix: PathLike,
        mode: str = "mmap",
        multimodal: bool = False,
        validate: bool = True,
        *,
        mmap: bool | None = None,
        validation_cache: PathLike | None = None,
    ) -> None:
        if mmap is not None:  # Megatron-Core's spelling: mmap=True -> "mmap", False -> file reads
            mode = "mmap" if mmap else "lazy"
        if mode not in READERS:
            raise ValueError(f"IndexedDataset mode={mode!r} is not one of {sorted(READERS)}")
        self.path_prefix = os.fspath(path_prefix)
        self.mode = mode
        self.multimodal = bool(multimodal)
        self._open(validate, validation_cache)

    # ------------------------------------------------------------------ opening
    def _open(self, validate: bool, validation_cache: PathLike | None = None) -> None:
        idx_path, bin_path = self.idx_path, self.bin_path
        for path in (idx_path, bin_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"indexed dataset file {path} not found (prefix {self.path_prefix!r} needs both .idx and .bin)"
                )
        identity = None
        if validate:  # taken before reading: a change made while we read gives a new identity
            identity, settled = file_identity(idx_path, bin_path, multimodal=self.multimodal)
            if is_remembered(identity, validation_cache):
                validate = False
            if not (validate and settled):
                identity = None  # nothing to remember
        header = read_header(idx_path)
        self.dtype: np.dtype = header.dtype
        idx_size = os.path.getsize(idx_path)
        expected = header.index_size(self.multimodal)
        if idx_size != expected:
            if idx_size < expected:
                raise IndexedFileError(
                    f"{idx_path}: truncated index file ({idx_size} bytes, header promises {expected})"
                )
            hint = ""
            if not self.multimodal and idx_size == header.index_size(True):
                hint = "; it looks multimodal: open it with multimodal=True"
            raise IndexedFileError(
                f"{idx_path}: index file has {idx_size} bytes, header promises {expected}{hint}"
            )

        if self.mode == "mmap":
            raw: np.ndarray = map_file(idx_path)
        else:
            raw = np.fromfile(idx_path, dtype=np.uint8)
            raw.flags.writeable = False
        n, d = header.sequence_count, header.document_count
        offset = HEADER_SIZE
        self.sequence_lengths: np.ndarray = np.frombuffer(
            raw, dtype=np.int32, count=n, offset=offset
        )
        offset += 4 * n
        self.sequence_pointers: np.ndarray = np.frombuffer(
            raw, dtype=np.int64, count=n, offset=offset
        )
        offset += 8 * n
        self.document_indices: np.ndarray = np.frombuffer(
            raw, dtype=np.int64, count=d, offset=offset
        )
        offset += 8 * d
        self.sequence_modes: np.ndarray | None = (
            np.frombuffer(raw, dtype=np.int8, count=n, offset=offset) if self.multimodal else None
        )
        self._bin_size = os.path.getsize(bin_path)
        self._check_index(validate)
        if identity is not None:
            remember(identity, validation_cache)
        self._reader = READERS[self.mode](bin_path, self.dtype)
        self._len = n

    def _check_index(self, full: bool) -> None:
        idx_path, bin_path = self.idx_path, self.bin_path
        lengths, pointers, docs = (
            self.sequence_lengths,
            self.sequence_pointers,
            self.document_indices,
        )
        n = len(lengths)
        itemsize = self.dtype.itemsize
        if len(docs) == 0 or docs[0] != 0:
            first = "nothing" if len(docs) == 0 else int(docs[0])
            raise IndexedFileError(f"{idx_path}: document_indices must start with 0, found {first}")
        if docs[-1] != n:
            raise IndexedFileError(
                f"{idx_path}: last document ends at sequence {int(docs[-1])}, but the index has {n} sequences"
            )
        if self._bin_size % itemsize:
            raise IndexedFileError(
                f"{bin_path}: size {self._bin_size} bytes is not a multiple of the {self.dtype} token size {itemsize}"
            )
        if full:
            check_index_arrays(
                lengths, pointers, docs, itemsize, self._bin_size, idx_path, bin_path
            )
            return
        end = int(pointers[-1]) + int(lengths[-1]) * itemsize if n else 0
        if end > self._bin_size:
            raise IndexedFileError(
                f"{idx_path}: index points past the end of {bin_path} (needs {end} bytes, file has {self._bin_size})"
            )

    # ------------------------------------------------------------------ paths and sizes
    @property
    def idx_path(self) -> str:
        """Path of the ``.idx`` file."""
        return get_idx_path(self.path_prefix)

    @property
    def bin_path(self) -> str:
        """Path of the ``.bin`` file."""
        return get_bin_path(self.path_prefix)

    @property
    def sequence_count(self) -> int:
        """Number of sequences N (same as ``len(ds)``)."""
        return self._len

    @property
    def document_count(self) -> int:
        """Number of documents (``len(document_indices) - 1``)."""
        return len(self.document_indices) - 1

    @property
    def num_tokens(self) -> int:
        """Total number of tokens in the ``.bin`` file."""
        return self._bin_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self._len

    # ------------------------------------------------------------------ reads
    def _normalize(self, idx: int | np.integer) -> int:
        i = int(idx)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(
                f"sequence index {int(idx)} out of range for {self._len} sequences in {self.path_prefix}"
            )
        return i

    def _span(self, i: int) -> tuple[int, int]:
        """Token offsets ``[start, stop)`` of sequence ``i``, checked (also when not validated)."""
        pointer, length = int(self.sequence_pointers[i]), int(self.sequence_lengths[i])
        if length < 0:
            raise IndexedFileError(f"{self.idx_path}: sequence {i} has negative length {length}")
        if pointer % self.dtype.itemsize:
            raise IndexedFileError(
                f"{self.idx_path}: sequence {i} starts at byte {pointer}, not a multiple of "
                f"{self.dtype.itemsize} ({self.dtype} tokens)"
            )
        start = pointer // self.dtype.itemsize
        stop = start + length
        if stop * self.dtype.itemsize > self._bin_size or start < 0:
            raise IndexedFileError(
                f"{self.idx_path}: sequence {i} points past the end of {self.bin_path} "
                f"(tokens {start}..{stop}, file has {self.num_tokens})"
            )
        return start, stop

    def __getitem__(self, idx: int | np.integer | slice) -> Any:
        """Return one sequence (``ds[i]``) or a list of sequences (``ds[a:b:step]``).

        Returns:
            ``np.ndarray`` of shape ``(sequence_lengths[i],)`` and dtype ``self.dtype``; for
            multimodal files ``(array, mode)``. A slice returns a list of arrays (multimodal:
            ``(list, modes)``); a contiguous slice is read in one go, like Megatron.

        Raises:
            IndexError: index out of range.
            TypeError: an index that is neither an integer nor a slice.
        """
        if isinstance(idx, (int, np.integer)):
            i = self._normalize(idx)
            start, stop = self._span(i)
            tokens = self._reader.read(start, stop)
            if self.sequence_modes is not None:
                return tokens, self.sequence_modes[i]
            return tokens
        if isinstance(idx, slice):
            first, last, step = idx.indices(self._len)
            if step == 1:
                if last <= first:
                    sequences: list[np.ndarray] = []
                else:
                    begin, _ = self._span(first)
                    _, end = self._span(last - 1)
                    block = self._reader.read(begin, end)
                    splits = np.cumsum(self.sequence_lengths[first : last - 1], dtype=np.int64)
                    sequences = np.split(block, splits)
            else:
                sequences = [self._reader.read(*self._span(i)) for i in range(first, last, step)]
            if self.sequence_modes is not None:
                return sequences, self.sequence_modes[idx]
            return sequences
        raise TypeError(f"IndexedDataset index must be an int or a slice, not {type(idx).__name__}")

    def get(self, idx: int | np.integer, offset: int = 0, length: int | None = None) -> Any:
        """Return part of one sequence: tokens ``[offset, offset + length)`` of sequence ``idx``.

        Args:
            idx: sequence index (negative counts from the end).
            offset: first token, ``0 <= offset <= sequence_lengths[idx]``.
            length: number of tokens; ``None`` = to the end of the sequence.

        Returns:
            ``np.ndarray`` of shape ``(length,)`` (multimodal: ``(array, mode)``).

        Raises:
            IndexError: ``idx`` out of range, or ``offset``/``length`` outside the sequence
                (Megatron would silently read into the next sequence).
        """
        i = self._normalize(idx)
        start, stop = self._span(i)
        size = stop - start
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(
                f"get({i}, offset={offset}, length={length}) is outside sequence {i} of length {size} "
                f"in {self.path_prefix}"
            )
        tokens = self._reader.read(start + offset, start + offset + length)
        if self.sequence_modes is not None:
            return tokens, self.sequence_modes[i]
        return tokens

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._len):
            yield self[i]

    # ------------------------------------------------------------------ Megatron compatibility
    def get_document_indices(self) -> np.ndarray:
        """Return ``document_indices`` (Megatron-Core's accessor)."""
        return self.document_indices

    def set_document_indices(self, document_indices: np.ndarray) -> None:
        """Replace ``document_indices`` in memory (Megatron-Core's accessor; files are untouched)."""
        self.document_indices = np.asarray(document_indices, dtype=np.int64)

    @staticmethod
    def exists(path_prefix: PathLike) -> bool:
        """Return whether both ``PREFIX.idx`` and ``PREFIX.bin`` exist."""
        return exists(path_prefix)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the files; the dataset cannot be read afterwards."""
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.close()

    def __enter__(self) -> IndexedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path_prefix": self.path_prefix, "mode": self.mode, "multimodal": self.multimodal}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path_prefix = state["path_prefix"]
        self.mode = state["mode"]
        self.multimodal = state["multimodal"]
        self._open(validate=False)

    def __repr__(self) -> str:
        return (
            f"IndexedDataset({self.path_prefix!r}, mode={self.mode!r}, sequences={self._len}, "
            f"documents={self.document_count}, dtype={self.dtype})"
        )


def _torch_to_numpy(values: Any, what: str) -> np.ndarray:
    """A torch tensor's values as a numpy array (any device; dtypes numpy lacks are refused)."""
    tensor = values.detach().cpu()
    if tensor.dtype.is_floating_point and tensor.dtype.itemsize < 4:  # bfloat16 / float8: no numpy
        tensor = tensor.float()
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError) as err:
        raise ValueError(
            f"{what}: token ids must be integers; a torch tensor of dtype {tensor.dtype} "
            f"cannot be read ({err})"
        ) from None


def _as_token_array(values: Any, dtype: np.dtype, what: str) -> np.ndarray:
    """Convert token ids to a 1-D array of ``dtype``, refusing values that do not fit.

    Args:
        values: any integer sequence Megatron's builder takes: a torch tensor (any
            integer dtype, any device), a numpy array (any integer dtype), a list, tuple or
            ``range`` of ints (numpy or torch scalars included), or a scalar (one token).
            Integral floats are accepted; nested equal-length sequences are flattened.
        dtype: the builder's token dtype.
        what: the file, for messages.

    Raises:
        ValueError: a value that is not an integer (fractional float, string, ``None``,
            ragged nesting, ...), or does not fit ``dtype`` (Megatron wraps or truncates).
    """
    if hasattr(values, "detach") and hasattr(
        values, "cpu"
    ):  # torch tensor, without importing torch
        values = _torch_to_numpy(values, what)
    if isinstance(values, str | bytes | bytearray | dict | set | frozenset):
        raise ValueError(f"{what}: token ids must be integers, got a {type(values).__name__}")
    try:
        array = np.asarray(values)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{what}: token ids must be a flat or rectangular integer sequence ({err})"
        ) from None
    if array.dtype.kind == "O":  # Python ints beyond int64, tensors of other dtypes, junk
        items = array.reshape(-1).tolist()
        items = [v.item() if hasattr(v, "item") and not isinstance(v, int) else v for v in items]
        for value in items:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(
                    f"{what}: token ids must be integers, got {type(value).__name__} {value!r}"
                )
        low, high = (min(items), max(items)) if items else (0, 0)
        if dtype.kind in "iu" and (low < np.iinfo(dtype).min or high > np.iinfo(dtype).max):
            info = np.iinfo(dtype)
            raise ValueError(
                f"{what}: token values {low}..{high} do not fit {dtype} ({info.min}..{info.max}); "
                "use a wider dtype"
            )
        array = np.asarray(items, dtype=dtype)
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    array = array.reshape(-1)
    if array.dtype == dtype:
        return array
    if array.dtype.kind not in "iubf":
        raise ValueError(
            f"{what}: token ids must be integers, got values of dtype {array.dtype} ({array.dtype.kind!r})"
        )
    if dtype.kind in "iu":
        if array.dtype.kind == "f":
            if not np.all(np.isfinite(array)) or not np.all(array == np.floor(array)):
                raise ValueError(f"{what}: non-integer token values cannot be stored as {dtype}")
        if not np.can_cast(array.dtype, dtype, casting="safe"):
            info = np.iinfo(dtype)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:
                raise ValueError(
                    f"{what}: token values {low}..{high} do not fit {dtype} ({info.min}..{info.max}); "
                    "use a wider dtype"
                )
    return array.astype(dtype)


def _as_counts(values: Any, what: str) -> np.ndarray:
    """Sequence lengths or counts as a 1-D int64 array of non-negative integers.

    Raises:
        ValueError: a non-integer or negative value (``what`` names the argument).
    """
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        values = _torch_to_numpy(values, what)
    try:
        array = np.asarray(values).reshape(-1)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{what} must be a flat sequence of integers ({err})") from None
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu" and not (
        array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array))
    ):
        raise ValueError(f"{what} must be integers, got {array.tolist()[:10]}")
    if (array < 0).any():
        raise ValueError(f"{what} must be non-negative, got {array.tolist()[:10]}")
    return array.astype(np.int64)


class IndexedDatasetBuilder:
    """Writes a Megatron ``.bin``/``.idx`` pair, atomically.

    Same methods as Megatron-Core's builder. Tokens go to a temporary file next to
    ``bin_path``; :meth:`finalize` writes the index to a temporary file too and then
    renames both into place (the ``.idx`` last), so an interrupted build never leaves
    a pair that looks complete. The index is kept in memory up to ~1M entries per
    array and then spilled to temporary files, so memory stays bounded for any corpus.

    Also usable as a context manager: leaving the block finalizes (to the ``.idx``
    next to ``bin_path``), leaving it with an exception discards everything.

    Args:
        bin_path: final path of the ``.bin`` file (parent directories are created).
        dtype: token dtype, one of Megatron's codes; default ``int32`` like Megatron.
            :func:`optimal_dtype` picks the smallest for a vocabulary.
        multimodal: store one int8 mode per sequence.

    Raises:
        ValueError: unsupported dtype; on adds, tokens that do not fit the dtype.
    """

    def __init__(self, bin_path: PathLike, dtype: Any = np.int32, multimodal: bool = False) -> None:
        self.bin_path = os.fspath(bin_path)
        self.dtype = normalize_dtype(dtype)
        self.multimodal = bool(multimodal)
        directory = os.path.dirname(os.path.abspath(self.bin_path))
        os.makedirs(directory, exist_ok=True)
        base = os.path.basename(self.bin_path)
        self._tmp_bin = temp_name(directory, base)
        self._data = open(self._tmp_bin, "xb", buffering=1 << 20)  # closed by finalize()/abort()
        self._directory = directory
        self._lengths = SpillArray(np.int32, directory, f"{base}.lengths")
        self._documents = SpillArray(np.int64, directory, f"{base}.documents")
        self._documents.append(0)
        self._modes = SpillArray(np.int8, directory, f"{base}.modes") if self.multimodal else None
        self._sequences_at_last_document = 0
        self._num_tokens = 0
        self._done = False

    # ------------------------------------------------------------------ adding data
    @property
    def sequence_count(self) -> int:
        """Sequences added so far."""
        return len(self._lengths)

    @property
    def document_count(self) -> int:
        """Documents ended so far."""
        return len(self._documents) - 1

    @property
    def num_tokens(self) -> int:
        """Tokens written so far."""
        return self._num_tokens

    # Megatron-Core's public lists, as read-only list views (the index may be spilled to disk)
    @property
    def sequence_lengths(self) -> SpillArrayView:
        """Tokens of each sequence added so far (list-like of ``int``, Megatron's attribute)."""
        return SpillArrayView(self._lengths, "sequence_lengths")

    @property
    def document_indices(self) -> SpillArrayView:
        """``0``, then the sequence count at the end of each document (Megatron's attribute)."""
        return SpillArrayView(self._documents, "document_indices")

    @property
    def sequence_modes(self) -> SpillArrayView | None:
        """Mode of each sequence (multimodal builders), else ``None`` (Megatron's attribute)."""
        return None if self._modes is None else SpillArrayView(self._modes, "sequence_modes")

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(
                f"IndexedDatasetBuilder for {self.bin_path} is already finalized or aborted"
            )

    def _write(self, array: np.ndarray) -> None:
        self._data.write(array.tobytes())
        self._num_tokens += array.size

    def add_item(self, tensor: Any, mode: int = 0) -> None:
        """Append one sequence (1-D token ids: torch tensor, numpy array or list)."""
        self._check_open()
        array = _as_token_array(tensor, self.dtype, self.bin_path)
        mode_array = self._mode_array([mode], 1, "add_item") if self._modes is not None else None
        self._write(array)
        self._lengths.append(array.size)
        if self._modes is not None:
            self._modes.extend(mode_array)

    def end_document(self) -> None:
        """Close the current document: the sequences added since the last one form it."""
        self._check_open()
        self._sequences_at_last_document = len(self._lengths)
        self._documents.append(self._sequences_at_last_document)

    def add_document(
        self, tensor: Any, lengths: Sequence[int], modes: Sequence[int] | None = None
    ) -> None:
        """Append a whole document: its tokens and the lengths of its sequences.

        Args:
            tensor: all tokens of the document, shape ``(sum(lengths),)``.
            lengths: tokens per sequence; ``[]`` adds an empty document (as Megatron does).
            modes: one mode per sequence (multimodal only; default 0).

        Raises:
            ValueError: ``sum(lengths)`` differs from the number of tokens.
        """
        self._check_open()
        array = _as_token_array(tensor, self.dtype, self.bin_path)
        lengths_array = _as_counts(lengths, "add_document: lengths")
        if int(lengths_array.sum()) != array.size or (lengths_array < 0).any():
            raise ValueError(
                f"add_document: lengths {list(lengths)} do not add up to {array.size} tokens"
            )
        mode_array = self._mode_array(modes, lengths_array.size, "add_document")
        self._write(array)
        self._lengths.extend(lengths_array)
        if self._modes is not None:
            self._modes.extend(mode_array)
        self.end_document()

    def add_documents(
        self,
        tokens: Any,
        sequence_lengths: Any,
        sequences_per_document: Any,
        modes: Any = None,
    ) -> None:
        """Append many documents at once (the fast path used by preprocessing).

        Args:
            tokens: all tokens, shape ``(sum(sequence_lengths),)``.
            sequence_lengths: tokens per sequence, shape ``(S,)``.
            sequences_per_document: sequences in each document, shape ``(D,)``, summing to ``S``
                (0 = an empty document).
            modes: one mode per sequence (multimodal only; default 0).

        Raises:
            ValueError: the counts do not add up.
        """
        self._check_open()
        array = _as_token_array(tokens, self.dtype, self.bin_path)
        lengths = _as_counts(sequence_lengths, "add_documents: sequence_lengths")
        per_doc = _as_counts(sequences_per_document, "add_documents: sequences_per_document")
        if int(lengths.sum()) != array.size or int(per_doc.sum()) != lengths.size:
            raise ValueError(
                f"add_documents: {array.size} tokens, sequence lengths summing to {int(lengths.sum())}, "
                f"{lengths.size} sequences vs {int(per_doc.sum())} in documents"
            )
        if (lengths < 0).any() or (per_doc < 0).any():
            raise ValueError("add_documents: negative sequence length or sequence count")
        mode_array = self._mode_array(modes, lengths.size, "add_documents")
        self._write(array)
        base = len(self._lengths)
        self._lengths.extend(lengths)
        if self._modes is not None:
            self._modes.extend(mode_array)
        if per_doc.size:
            self._documents.extend(base + np.cumsum(per_doc))
            self._sequences_at_last_document = len(self._lengths)

    def _mode_array(self, modes: Any, count: int, what: str) -> np.ndarray:
        """``modes`` as int8 ``[count]`` (zeros when ``None``), checked before anything is written."""
        if modes is None:
            return np.zeros(count, dtype=np.int8)
        values = np.asarray(modes).reshape(-1)
        if values.size != count:
            raise ValueError(f"{what}: {values.size} modes for {count} sequences")
        if values.size and (
            values.dtype.kind not in "iu" or values.min() < -128 or values.max() > 127
        ):
            raise ValueError(
                f"{what}: modes must be int8 values (-128..127), got {values.tolist()}"
            )
        return values.astype(np.int8)

    def add_index(self, path_prefix: PathLike) -> None:
        """Append a whole existing dataset (merge), keeping its document boundaries.

        A dataset of another integer dtype is converted when its tokens fit this
        builder's dtype (checked chunk by chunk); Megatron requires equal dtypes.

        Raises:
            IndexedFileError / FileNotFoundError: the dataset cannot be opened.
            ValueError: its tokens do not fit this dtype, or multimodal does not match.
                The builder is then aborted (part of the dataset may have been added).
        """
        self._check_open()
        other = IndexedDataset(path_prefix, mode="mmap", multimodal=self.multimodal)
        try:
            self._append_dataset(other)
        except BaseException:
            self.abort()
            raise
        finally:
            other.close()

    def _append_dataset(self, other: IndexedDataset) -> None:
        """Append ``other``'s index entries and tokens (converted to this dtype)."""
        base = len(self._lengths)
        for start in range(0, len(other), CHUNK):
            self._lengths.extend(other.sequence_lengths[start : start + CHUNK])
            if self._modes is not None and other.sequence_modes is not None:
                self._modes.extend(other.sequence_modes[start : start + CHUNK])
        docs = other.document_indices
        for start in range(1, len(docs), CHUNK):
            self._documents.extend(docs[start : start + CHUNK] + base)
        self._sequences_at_last_document = len(self._lengths)
        self._data.flush()
        if other.dtype == self.dtype:
            with open(other.bin_path, "rb") as source:
                while block := source.read(1 << 24):
                    self._data.write(block)
            self._num_tokens += other.num_tokens
        else:
            step = (1 << 24) // other.dtype.itemsize
            for start in range(0, other.num_tokens, step):
                part = other._reader.read(start, min(start + step, other.num_tokens))
                self._write(_as_token_array(part, self.dtype, other.bin_path))

    # ------------------------------------------------------------------ finishing
    def finalize(self, idx_path: PathLike | None = None) -> None:
        """Write the index and move both files into place.

        Args:
            idx_path: final ``.idx`` path; default: ``bin_path`` with ``.bin`` replaced by ``.idx``.

        Raises:
            ValueError: sequences were added after the last :meth:`end_document` (Megatron-Core's
                reader rejects such files), or the builder is already finalized.
        """
        self._check_open()
        if idx_path is None:
            if not self.bin_path.endswith(".bin"):
                raise ValueError(f"finalize: give idx_path, {self.bin_path} does not end with .bin")
            idx_path = self.bin_path[: -len(".bin")] + ".idx"
        idx_path = os.fspath(idx_path)
        if self._sequences_at_last_document != len(self._lengths):
            pending = len(self._lengths) - self._sequences_at_last_document
            self.abort()
            raise ValueError(
                f"finalize {self.bin_path}: {pending} sequence(s) added after the last end_document(); "
                "call end_document() before finalize()"
            )
        try:
            self._data.flush()
            os.fsync(self._data.fileno())
            self._data.close()
            tmp_idx = self._write_index(idx_path)
            if os.path.exists(idx_path):
                os.remove(idx_path)  # never leave a new .bin next to an old .idx
            os.replace(self._tmp_bin, self.bin_path)
            os.replace(tmp_idx, idx_path)
            fsync_dir(os.path.dirname(os.path.abspath(idx_path)))
        except BaseException:
            self.abort()
            raise
        for spill in (self._lengths, self._documents, self._modes):
            if spill is not None:
                spill.unlink()  # no file left behind; the views stay readable, like Megatron's lists
        self._done = True

    def _write_index(self, idx_path: str) -> str:
        header = IndexHeader(self.dtype, len(self._lengths), len(self._documents))
        directory = os.path.dirname(os.path.abspath(idx_path))
        os.makedirs(directory, exist_ok=True)
        tmp_idx = temp_name(directory, os.path.basename(idx_path))
        try:
            with open(tmp_idx, "xb", buffering=1 << 20) as out:
                out.write(header.pack())
                for chunk in self._lengths.chunks():
                    out.write(chunk.tobytes())
                pointer = 0
                itemsize = self.dtype.itemsize
                for chunk in self._lengths.chunks():
                    ends = pointer + np.cumsum(chunk.astype(np.int64) * itemsize)
                    starts = np.concatenate(([pointer], ends[:-1])).astype(np.int64)
                    out.write(starts.tobytes())
                    pointer = int(ends[-1])
                for chunk in self._documents.chunks():
                    out.write(chunk.tobytes())
                if self._modes is not None:
                    for chunk in self._modes.chunks():
                        out.write(chunk.tobytes())
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            _remove_quietly(tmp_idx)
            raise
        return tmp_idx

    def abort(self) -> None:
        """Discard everything written; no file is left at the final paths."""
        if self._done:
            return
        self._done = True
        try:
            self._data.close()
        finally:
            _remove_quietly(self._tmp_bin)
            self._discard_spills()

    def _discard_spills(self) -> None:
        for spill in (self._lengths, self._documents, self._modes):
            if spill is not None:
                spill.discard()

    def __enter__(self) -> IndexedDatasetBuilder:
        return self

    def __exit__(self, exc_type: type | None, *rest: object) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.finalize()

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self.abort()


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def write_indexed_dataset(
    path_prefix: PathLike,
    documents: Iterable[Any],
    dtype: Any = np.int32,
    multimodal: bool = False,
) -> str:
    """Write documents of token ids to ``PREFIX.bin``/``PREFIX.idx`` in one call.

    Args:
        path_prefix: output prefix.
        documents: each item is one document: either a 1-D sequence of token ids (one
            sequence) or a list of such sequences (several sequences, e.g. sentences).
        dtype: token dtype (see :func:`optimal_dtype`).
        multimodal: write mode 0 for every sequence (Megatron's multimodal layout).

    Returns:
        ``path_prefix`` as a string.

    Raises:
        ValueError: a token does not fit ``dtype``.
    """
    prefix = os.fspath(path_prefix)
    with IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype, multimodal=multimodal) as builder:
        for document in documents:
            if isinstance(document, (list, tuple)) and document and not np.isscalar(document[0]):
                for sequence in document:
                    builder.add_item(sequence)
                builder.end_document()
            else:
                builder.add_item(document)
                builder.end_document()
    return prefix


def merge_indexed_datasets(
    path_prefixes: Sequence[PathLike],
    output_prefix: PathLike,
    dtype: Any = None,
    multimodal: bool = False,
) -> IndexedDataset:
    """Concatenate datasets (sequences and documents, in the given order) into one.

    Args:
        path_prefixes: the datasets to merge, at least one.
        output_prefix: the merged dataset's prefix; may be one of the inputs (the output
            is written to temporary files and renamed at the end).
        dtype: token dtype of the output; default the narrowest dtype that holds every
            input's dtype (``numpy.result_type``), e.g. uint16 + int32 -> int32.
        multimodal: the inputs are multimodal (every one must be).

    Returns:
        The merged dataset, opened in ``mmap`` mode.

    Raises:
        ValueError: no inputs, or tokens that do not fit ``dtype``.
        FileNotFoundError / IndexedFileError: an input cannot be opened.
    """
    if not path_prefixes:
        raise ValueError("merge needs at least one input prefix")
    if dtype is None:
        dtypes = [read_header(get_idx_path(prefix)).dtype for prefix in path_prefixes]
        dtype = normalize_dtype(np.result_type(*dtypes))
    output_prefix = os.fspath(output_prefix)
    with IndexedDatasetBuilder(
        get_bin_path(output_prefix), dtype=dtype, multimodal=multimodal
    ) as builder:
        for prefix in path_prefixes:
            builder.add_index(prefix)
    return IndexedDataset(output_prefix, multimodal=multimodal)
