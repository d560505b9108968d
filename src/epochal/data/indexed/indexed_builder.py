"""Writing Megatron's indexed dataset (``.bin`` + ``.idx``): the builder, one-call writing, merging.

The builder writes to temporary names and renames on :meth:`IndexedDatasetBuilder.finalize`,
keeps its index in bounded memory (spilling to disk) and rejects token ids that do not
fit its dtype instead of wrapping them. The files are byte for byte what Megatron-Core's
``IndexedDatasetBuilder`` writes (see :mod:`epochal.data.indexed.indexed_format`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from epochal._atomic import fsync_dir
from epochal.data.indexed.indexed_format import (
    IndexHeader,
    PathLike,
    get_bin_path,
    get_idx_path,
    normalize_dtype,
    read_header,
)
from epochal.data.indexed.indexed_reader import IndexedDataset
from epochal.data.indexed.spill_array import CHUNK, SpillArray, SpillArrayView, temp_name
from epochal.data.indexed.token_arrays import _as_counts, _as_token_array


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
