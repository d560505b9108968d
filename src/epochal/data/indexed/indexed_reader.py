"""Reading Megatron's indexed dataset (``.bin`` + ``.idx``): :class:`IndexedDataset`.

Opening validates the pair (magic, version, dtype code, sizes, every pointer and document
boundary) and raises :class:`IndexedFileError` naming the file, where Megatron asserts or
returns wrong tokens. ``mode="mmap"`` maps the files, ``mode="lazy"`` reads with ``pread``
(no mmap) and ``mode="cached"`` holds both files in memory (the per-mode readers of the
``.bin`` file are in :mod:`epochal.data.indexed.bin_readers`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from epochal.data.indexed.bin_readers import READERS, map_file
from epochal.data.indexed.indexed_format import (
    HEADER_SIZE,
    IndexedFileError,
    PathLike,
    exists,
    get_bin_path,
    get_idx_path,
    read_header,
)
from epochal.data.indexed.indexed_validation import (
    check_index_arrays,
    file_identity,
    is_remembered,
    remember,
)


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
        self.validated = bool(validate)  # the full check passes below, or passed before
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

    def read_pieces(
        self, ids: np.ndarray, first_offset: int, last_stop: int, out: np.ndarray
    ) -> int:
        """Copy sequences ``ids`` laid end to end into ``out``; return the tokens written.

        The first sequence is copied from token ``first_offset``, the last one up to token
        ``last_stop`` (exclusive), every other one whole (one sequence: tokens
        ``[first_offset, last_stop)``). This is what a GPT window reads; with a validated
        index in ``mmap`` or ``cached`` mode it is one slice copy per sequence, without
        the per-read checks of :meth:`get` (the open-time check covers every sequence).

        Args:
            ids: int array ``[k >= 1]`` of sequence indices.
            first_offset: first token of ``ids[0]``.
            last_stop: end (exclusive) of the tokens of ``ids[-1]``.
            out: 1-D array with room for the tokens (any numeric dtype; values are cast).

        Returns:
            The number of tokens written to the start of ``out``.

        Raises:
            IndexError: a sequence index out of range, offsets outside their sequences,
                or more tokens than ``out`` holds (nothing is read then).
            TypeError: a multimodal dataset (its reads carry modes).
        """
        if self.sequence_modes is not None:
            raise TypeError(
                f"read_pieces reads token-only datasets; {self.path_prefix} is multimodal"
            )
        tokens = self._reader.tokens if self.validated else None
        if tokens is None:  # lazy mode or unvalidated index: the checked per-sequence reads
            return self._read_pieces_checked(ids, first_offset, last_stop, out)
        pointers, lengths = self.sequence_pointers, self.sequence_lengths
        itemsize = self.dtype.itemsize
        ids_list = ids.tolist()
        last = len(ids_list) - 1
        spans = []
        total = 0
        for n, i in enumerate(ids_list):
            if not 0 <= i < self._len:
                raise IndexError(f"sequence index {i} out of range for {self._len} sequences")
            start = int(pointers[i]) // itemsize
            length = int(lengths[i])
            first = first_offset if n == 0 else 0
            stop = last_stop if n == last else length
            if not 0 <= first <= stop <= length:
                raise IndexError(
                    f"read_pieces: tokens [{first}, {stop}) are outside sequence {i} of length "
                    f"{length} in {self.path_prefix}"
                )
            spans.append((start + first, start + stop))
            total += stop - first
        if total > out.shape[0]:
            raise IndexError(
                f"read_pieces({ids_list}, {first_offset}, {last_stop}) reads {total} tokens of "
                f"{self.path_prefix}; out holds {out.shape[0]}"
            )
        np.concatenate([tokens[a:b] for a, b in spans], out=out[:total], casting="unsafe")
        return total

    def _read_pieces_checked(
        self, ids: np.ndarray, first_offset: int, last_stop: int, out: np.ndarray
    ) -> int:
        ids_list = ids.tolist()
        if len(ids_list) == 1:
            parts = [self.get(ids_list[0], first_offset, last_stop - first_offset)]
        else:
            parts = [self.get(ids_list[0], first_offset)]
            parts.extend(self.get(i) for i in ids_list[1:-1])
            parts.append(self.get(ids_list[-1], 0, last_stop))
        total = sum(len(part) for part in parts)
        if total > out.shape[0]:
            raise IndexError(
                f"read_pieces({ids_list}, {first_offset}, {last_stop}) reads {total} tokens of "
                f"{self.path_prefix}; out holds {out.shape[0]}"
            )
        np.concatenate(parts, out=out[:total], casting="unsafe")
        return total

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
        return {
            "path_prefix": self.path_prefix,
            "mode": self.mode,
            "multimodal": self.multimodal,
            "validated": self.validated,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path_prefix = state["path_prefix"]
        self.mode = state["mode"]
        self.multimodal = state["multimodal"]
        self._open(validate=False)  # the O(1) checks; the full one is the original's
        self.validated = bool(state.get("validated", False))

    def __repr__(self) -> str:
        return (
            f"IndexedDataset({self.path_prefix!r}, mode={self.mode!r}, sequences={self._len}, "
            f"documents={self.document_count}, dtype={self.dtype})"
        )
