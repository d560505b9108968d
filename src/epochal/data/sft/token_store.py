"""The tokenized rows of one fine-tuning file as files: Megatron indexed tokens and loss masks.

A store is a folder that :class:`StoreWriter` fills one row at a time (memory does not
grow with the file) and :func:`open_store` maps:

- ``tokens.bin`` / ``tokens.idx``: a Megatron indexed dataset (byte for byte what
  Megatron-Core's ``IndexedDatasetBuilder`` writes), one sequence and one document a
  kept row, in row order, with the smallest token dtype for the vocabulary;
- ``loss_mask.bin`` / ``loss_mask.idx``: the same layout, ``uint8``, 1 where the token
  is a training target;
- ``examples.npy``: per kept row (int64 ``[K, 3]``): its 0-based row in the file, its
  loss tokens (``loss_mask[1:].sum()``), and the digest of its tokens and mask
  (:func:`row_digest`, as int64 bits);
- ``rows.npy``: per row of the file (int32 ``[N, 2]``): its status (``KEPT``,
  ``TRUNCATED``, ``SKIPPED``, ``DROPPED`` of :mod:`epochal.data.sft.tokenize`) and the
  tokens cut off it;
- ``store.json``: the counts, the row format and what the store was built from,
  written last.

:class:`TokenizedRows` reads a store (or a contiguous range of its rows, a split
part) as a sequence of :class:`~epochal.data.sft.tokenize.SFTExample`: the same ids
and masks :func:`~epochal.data.sft.tokenize.tokenize_sft_rows` gives, from memory maps.
"""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from epochal.data.datasets.index_cache import pickle_arrays, unpickle_arrays
from epochal.data.indexed.indexed_builder import IndexedDatasetBuilder
from epochal.data.indexed.indexed_format import optimal_dtype
from epochal.data.indexed.indexed_reader import IndexedDataset
from epochal.data.sft.tokenize import (
    DROPPED,
    SKIPPED,
    TRUNCATED,
    LimitedRow,
    SFTExample,
    SFTReport,
)

__all__ = ["StoreError", "StoreWriter", "TokenizedRows", "open_store", "row_digest"]

#: bump when the files or their meaning change: older stores are then not read
STORE_VERSION = 1
_MANIFEST = "store.json"


class StoreError(ValueError):
    """A store folder that is incomplete or does not match its manifest (names the file)."""


def row_digest(input_ids: np.ndarray, loss_mask: np.ndarray) -> int:
    """A 64-bit digest of one example's ids (as int64) and loss mask, as a signed int64."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(input_ids, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(loss_mask, dtype=np.uint8).tobytes())
    return int(np.frombuffer(h.digest(), dtype="<i8")[0])


class StoreWriter:
    """Writes a store folder row by row (see the module docstring).

    Args:
        folder: an empty folder to write into (the caller renames it into place).
        vocab_size: ids are ``0 .. vocab_size - 1`` (picks the token dtype).

    Raises:
        ValueError: on :meth:`add`, an id that does not fit the token dtype.
    """

    def __init__(self, folder: str | os.PathLike, vocab_size: int) -> None:
        self.folder = Path(folder)
        self._tokens = IndexedDatasetBuilder(self.folder / "tokens.bin", optimal_dtype(vocab_size))
        self._masks = IndexedDatasetBuilder(self.folder / "loss_mask.bin", np.uint8)
        self._examples = array("q")  # row, loss tokens, digest: 24 bytes a kept row
        self._rows = array("i")  # status, cut: 8 bytes a row
        self._kind: str | None = None
        self._prefix_masked = 0

    def add(self, limited: LimitedRow) -> None:
        """Append one row (in file order)."""
        if self._kind is None:
            self._kind = limited.row.kind
        self._rows.extend((limited.status, limited.cut))
        example = limited.example
        if example is None:
            return
        self._tokens.add_document(example.input_ids, [len(example)])
        self._masks.add_document(example.loss_mask.astype(np.uint8), [len(example)])
        digest = row_digest(example.input_ids, example.loss_mask)
        self._examples.extend((example.index, example.num_loss_tokens, digest))
        self._prefix_masked += bool(limited.prefix_masked)

    def finish(self, identity: dict[str, Any], max_length: int | None) -> None:
        """Write the indices and the manifest (last).

        Args:
            identity: what the store was built from (kept in the manifest).
            max_length: the length limit the rows were tokenized with.
        """
        self._tokens.finalize(self.folder / "tokens.idx")
        self._masks.finalize(self.folder / "loss_mask.idx")
        examples = np.frombuffer(self._examples, dtype=np.int64).reshape(-1, 3)
        rows = np.frombuffer(self._rows, dtype=np.int32).reshape(-1, 2)
        np.save(self.folder / "examples.npy", examples, allow_pickle=False)
        np.save(self.folder / "rows.npy", rows, allow_pickle=False)
        manifest = {
            "version": STORE_VERSION,
            "identity": identity,
            "rows": int(rows.shape[0]),
            "examples": int(examples.shape[0]),
            "kind": self._kind,
            "prefix_masked": self._prefix_masked,  # all kept rows or none (one template)
            "max_length": max_length,
        }
        text = json.dumps(manifest, indent=2, sort_keys=True)
        (self.folder / _MANIFEST).write_text(text, encoding="utf-8")

    def abort(self) -> None:
        """Discard the builders' temporary files (the caller removes the folder)."""
        self._tokens.abort()
        self._masks.abort()


class _FlatSequences:
    """``IndexedDataset``'s reads over arrays in memory (a store read without maps)."""

    def __init__(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.flat = flat
        self.sequence_lengths = lengths
        self._starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

    def __len__(self) -> int:
        return int(self.sequence_lengths.shape[0])

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self._starts[i] : self._starts[i + 1]]


def _read_indexed(prefix: Path, mmap: bool) -> Any:
    data = IndexedDataset(prefix, mode="mmap", validate=True)
    if mmap:
        return data
    lengths = np.array(data.sequence_lengths)
    flat = np.fromfile(data.bin_path, dtype=data.dtype)
    data.close()
    return _FlatSequences(flat, lengths)


def _read_array(path: Path, shape: tuple[int, int], dtype: str, mmap: bool) -> np.ndarray:
    try:
        value = np.load(path, mmap_mode="r" if mmap and shape[0] else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise StoreError(f"{path}: unreadable ({exc})") from None
    if value.shape != shape or value.dtype != np.dtype(dtype):
        raise StoreError(
            f"{path}: holds {value.dtype}{list(value.shape)}, expected {dtype}{list(shape)}"
        )
    return value


def open_store(
    folder: str | os.PathLike, source: str, *, identity: dict[str, Any], mmap: bool = True
) -> TokenizedRows:
    """Read a store folder written by :class:`StoreWriter`.

    Args:
        folder: the store.
        source: the file its rows come from (the examples' ``source``).
        identity: what it must have been built from (compared with its manifest).
        mmap: map the files (``False``: read them into memory, for a folder about to
            be deleted).

    Raises:
        FileNotFoundError: no manifest (an absent or unfinished store).
        StoreError: a manifest of another version or identity, or files that do not
            match it or each other (names the file).
    """
    root = Path(folder)
    path = root / _MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise StoreError(f"{path}: unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("version") != STORE_VERSION:
        raise StoreError(f"{path}: not a version {STORE_VERSION} store")
    if manifest.get("identity") != identity:
        raise StoreError(f"{path}: built from other rows, tokenizer or options")
    try:
        n_rows, n_examples = int(manifest["rows"]), int(manifest["examples"])
        tokens = _read_indexed(root / "tokens", mmap)
        masks = _read_indexed(root / "loss_mask", mmap)
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{path}: malformed ({exc!r})") from None
    except (OSError, ValueError) as exc:  # IndexedFileError is a ValueError
        raise StoreError(str(exc)) from None
    examples = _read_array(root / "examples.npy", (n_examples, 3), "int64", mmap)
    rows = _read_array(root / "rows.npy", (n_rows, 2), "int32", mmap)
    if len(tokens) != n_examples or not np.array_equal(
        tokens.sequence_lengths, masks.sequence_lengths
    ):
        raise StoreError(f"{root}: tokens.idx and loss_mask.idx do not describe the same rows")
    return TokenizedRows(
        source,
        tokens,
        masks,
        examples,
        rows,
        prefix_masked=bool(manifest.get("prefix_masked")),
        max_length=manifest.get("max_length"),
    )


class TokenizedRows(Sequence[SFTExample]):
    """The kept examples of a file's rows ``[first_row, stop_row)``, read from a store.

    ``rows[i]`` is :class:`~epochal.data.sft.tokenize.SFTExample` ``i`` (ids int64
    ``[L]``, mask bool ``[L]``), equal to what
    :func:`~epochal.data.sft.tokenize.tokenize_sft_rows` gives for those rows. Pickles
    as file names when the store is mapped (``DataLoader`` workers map the same files).

    Attributes:
        source: the file the rows come from.
        first_row / stop_row: the file rows covered.
        num_rows: ``stop_row - first_row`` (rows read, kept or not).
    """

    def __init__(
        self,
        source: str,
        tokens: Any,
        masks: Any,
        examples: np.ndarray,
        rows: np.ndarray,
        *,
        prefix_masked: bool,
        max_length: int | None,
        first_row: int = 0,
        stop_row: int | None = None,
    ) -> None:
        self.source = source
        self._tokens, self._masks = tokens, masks
        self._examples, self._rows = examples, rows
        self._prefix_masked = prefix_masked
        self.max_length = max_length
        self.first_row = first_row
        self.stop_row = int(rows.shape[0]) if stop_row is None else stop_row
        file_rows = examples[:, 0]
        self._first = int(np.searchsorted(file_rows, first_row))
        self._stop = int(np.searchsorted(file_rows, self.stop_row))

    @property
    def num_rows(self) -> int:
        """Rows of the file in this range (kept or not)."""
        return self.stop_row - self.first_row

    def part(self, first_row: int, stop_row: int) -> TokenizedRows:
        """The examples of file rows ``[first_row, stop_row)`` (a split part), sharing the store."""
        if not self.first_row <= first_row <= stop_row <= self.stop_row:
            raise IndexError(f"rows [{first_row}, {stop_row}) are not inside this part")
        return TokenizedRows(
            self.source,
            self._tokens,
            self._masks,
            self._examples,
            self._rows,
            prefix_masked=self._prefix_masked,
            max_length=self.max_length,
            first_row=first_row,
            stop_row=stop_row,
        )

    def __len__(self) -> int:
        return self._stop - self._first

    def _at(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} out of range for {len(self)} examples")
        return self._first + i

    def __getitem__(self, i: int) -> SFTExample:  # type: ignore[override]
        k = self._at(int(i))
        row = int(self._examples[k, 0])
        ids = np.asarray(self._tokens[k], dtype=np.int64)
        mask = np.asarray(self._masks[k]).astype(bool)
        return SFTExample(ids, mask, self.source, row, int(self._rows[row, 1]))

    def __iter__(self) -> Iterator[SFTExample]:
        for i in range(len(self)):
            yield self[i]

    @property
    def lengths(self) -> np.ndarray:
        """int32 ``[len(self)]``: each example's tokens."""
        return np.asarray(self._tokens.sequence_lengths[self._first : self._stop])

    @property
    def loss_tokens(self) -> np.ndarray:
        """int64 ``[len(self)]``: each example's training targets (``loss_mask[1:].sum()``)."""
        return np.asarray(self._examples[self._first : self._stop, 1])

    @property
    def digests(self) -> np.ndarray:
        """int64 ``[len(self)]``: each example's :func:`row_digest`."""
        return np.asarray(self._examples[self._first : self._stop, 2])

    @property
    def row_indices(self) -> np.ndarray:
        """int64 ``[len(self)]``: each example's 0-based row in the file."""
        return np.asarray(self._examples[self._first : self._stop, 0])

    def report(self) -> SFTReport:
        """The :class:`~epochal.data.sft.tokenize.SFTReport` of these rows."""
        rows = np.asarray(self._rows[self.first_row : self.stop_row])
        status, cut = rows[:, 0], rows[:, 1]
        examples = len(self)
        return SFTReport(
            rows=self.num_rows,
            examples=examples,
            skipped=int((status == SKIPPED).sum()),
            truncated=int(((status == TRUNCATED) | (status == DROPPED)).sum()),
            truncated_tokens=int(cut.sum(dtype=np.int64)),
            dropped_no_loss=int((status == DROPPED).sum()),
            tokens=int(self.lengths.sum(dtype=np.int64)),
            loss_tokens=int(self.loss_tokens.sum(dtype=np.int64)),
            max_length=self.max_length,
            prefix_masked=examples if self._prefix_masked else 0,
        )

    def __getstate__(self) -> dict[str, Any]:
        return pickle_arrays(self.__dict__, ("_examples", "_rows"))

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(unpickle_arrays(state, ("_examples", "_rows")))
