"""The per-chunk work of preprocessing: read JSONL blocks, parse, tokenize in batches.

A *chunk* is about ``chunk_bytes`` of whole lines of one input file (or a list of
documents for :func:`epochal.data.preprocess.preprocess_documents`). Workers turn a
chunk into compact numpy arrays, one set per JSON key, which the main process appends
to the output files in input order. Nothing here keeps more than one chunk in memory.
"""

from __future__ import annotations

import glob
import json
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from epochal.data.indexed.preprocess_arrow import (
    ARROW_SUFFIXES,
    cached_dataset_files,
    is_dataset_name,
    saved_dataset_files,
)
from epochal.data.indexed.preprocess_chunks import Chunk
from epochal.data.indexed.token_arrays import _as_token_array
from epochal.data.indexed.tokenizer import Tokenizer

INPUT_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz")
_GLOB_CHARS = set("*?[")


def find_input_files(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Expand inputs into a de-duplicated list of files.

    Args:
        inputs: files (``.jsonl[.gz]``, ``.json[.gz]``, ``.parquet``, ``.arrow``), folders
            written by ``datasets``' ``save_to_disk`` (their ``.arrow`` files in row order),
            other directories (every file with those suffixes below them, recursively,
            sorted by path), glob patterns (``**`` allowed), or the name of a Hugging Face
            dataset already in the local hub cache, ``owner/name[:split]`` (see
            :func:`~epochal.data.indexed.preprocess_arrow.cached_dataset_files`; nothing is
            downloaded). Inputs keep their given order.

    Raises:
        FileNotFoundError: an input matches no file (a name: not in the local cache).
        PreprocessError: a ``DatasetDict`` folder or a cached dataset with several splits
            (one must be chosen), or a broken ``save_to_disk`` folder.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[str] = []
    for item in inputs:
        item = os.fspath(item)
        if not os.path.exists(item) and not _GLOB_CHARS & set(item) and is_dataset_name(item):
            found = cached_dataset_files(item)
        elif os.path.isdir(item):
            found = saved_dataset_files(item)
            if found is None:
                found = sorted(
                    os.path.join(root, name)
                    for root, _, names in os.walk(item)
                    for name in names
                    if name.endswith(INPUT_SUFFIXES + ARROW_SUFFIXES)
                )
        elif os.path.isfile(item):
            found = [item]
        elif _GLOB_CHARS & set(item):
            found = sorted(path for path in glob.glob(item, recursive=True) if os.path.isfile(path))
        else:
            found = []
        if not found:
            raise FileNotFoundError(
                f"input {item} matches no file (give .jsonl[.gz], .parquet or .arrow files, a "
                "directory, a save_to_disk folder or a glob)"
            )
        files.extend(found)
    return list(dict.fromkeys(files))


@dataclass
class EncodedChunk:
    """The output of one chunk.

    Attributes:
        documents: documents accepted.
        bad_lines: ``(line number, reason)`` of rejected lines.
        outputs: per JSON key ``(tokens, sequence_lengths, sequences_per_document)``.
        num_tokens: tokens over all keys.
    """

    file_index: int
    documents: int = 0
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    outputs: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    num_tokens: int = 0


class ChunkEncoder:
    """Turns chunks into token arrays; picklable, sent once to each worker.

    Args:
        tokenizer: the tokenizer.
        json_keys: keys to read from each JSON line, one output per key.
        append_eod: append ``tokenizer.eod`` to each non-empty document (Megatron's rule).
        dtype: output token dtype (ids that do not fit raise ``ValueError``).
        splitter: a sentence splitter (``tokenize(text) -> list[str]``): each text becomes
            its sentences, one sequence each (``--split-sentences``); ``None``: one
            sequence per text.
        max_line_bytes: lines longer than this are bad lines (``None``: no limit).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        json_keys: Sequence[str],
        append_eod: bool,
        dtype: np.dtype,
        splitter: Any = None,
        max_line_bytes: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.json_keys = list(json_keys)
        self.append_eod = append_eod
        self.dtype = dtype
        self.splitter = splitter
        self.max_line_bytes = max_line_bytes

    def __call__(self, chunk: Chunk) -> EncodedChunk:
        result = EncodedChunk(chunk.file_index)
        if isinstance(chunk.data, bytes):
            result.bad_lines.extend(
                (number, f"line longer than --max-line-bytes={self.max_line_bytes:,}")
                for number in chunk.too_long
            )
            documents = self._parse(chunk, result.bad_lines)
        elif chunk.columns:
            documents = self._check_rows(chunk, result.bad_lines)
        else:
            documents = [(chunk.first_line + i, (doc,)) for i, doc in enumerate(chunk.data)]
        try:
            outputs = self._encode_all(documents)
        except (TypeError, ValueError):  # e.g. a lone surrogate the tokenizer refuses; find it
            documents = self._drop_unencodable(documents, result.bad_lines)
            outputs = self._encode_all(documents)
        result.documents = len(documents)
        result.outputs = outputs
        result.num_tokens = sum(int(tokens.size) for tokens, _, _ in outputs)
        result.bad_lines.sort()
        return result

    def _encode_all(
        self, documents: list[tuple[int, tuple[Any, ...]]]
    ) -> list[tuple[np.ndarray, ...]]:
        return [
            self._encode_key([values[key_index] for _, values in documents])
            for key_index in range(len(self.json_keys))
        ]

    def _parse(self, chunk: Chunk, bad: list[tuple[int, str]]) -> list[tuple[int, tuple[Any, ...]]]:
        assert isinstance(chunk.data, bytes)
        documents = []
        lines = chunk.data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        limit = self.max_line_bytes
        for number, line in enumerate(lines, start=chunk.first_line):
            if limit is not None and len(line) > limit:
                bad.append((number, f"line longer than --max-line-bytes={limit:,}"))
                continue
            if not line.strip():
                continue  # blank lines are not documents
            try:
                record = json.loads(line)
            except UnicodeDecodeError as exc:
                bad.append((number, f"invalid UTF-8 ({exc.reason} at byte {exc.start})"))
                continue
            except (ValueError, RecursionError) as exc:
                bad.append((number, f"invalid JSON ({exc})"))
                continue
            if not isinstance(record, dict):
                bad.append((number, f"expected a JSON object, got {type(record).__name__}"))
                continue
            missing = next((key for key in self.json_keys if key not in record), None)
            if missing is not None:
                bad.append((number, f"missing key {missing!r}"))
                continue
            values = tuple(record[key] for key in self.json_keys)
            reason = self._bad_value(values)
            if reason:
                bad.append((number, reason))
            else:
                documents.append((number, values))
        return documents

    def _check_rows(
        self, chunk: Chunk, bad: list[tuple[int, str]]
    ) -> list[tuple[int, tuple[Any, ...]]]:
        """Rows of a parquet/arrow chunk whose values are strings or lists of strings, and
        whose text is at most ``max_line_bytes`` of UTF-8."""
        documents = []
        limit = self.max_line_bytes
        for number, values in enumerate(chunk.data, start=chunk.first_line):
            reason = self._bad_value(values)
            if not reason and limit is not None and _text_bytes(values, limit) > limit:
                reason = f"row longer than --max-line-bytes={limit:,}"
            if reason:
                bad.append((number, reason))
            else:
                documents.append((number, values))
        return documents

    def _bad_value(self, values: Sequence[Any]) -> str:
        """Why a record's ``json_keys`` values are not documents, or ``""``."""
        for key, value in zip(self.json_keys, values):
            if not (
                isinstance(value, str)
                or (isinstance(value, list) and all(isinstance(v, str) for v in value))
            ):
                kind = "null" if value is None else type(value).__name__
                return f"key {key!r} is {kind}, expected a string or list of strings"
        return ""

    def _drop_unencodable(
        self, documents: list[tuple[int, tuple[Any, ...]]], bad: list[tuple[int, str]]
    ) -> list[tuple[int, tuple[Any, ...]]]:
        """Reject documents whose text the tokenizer cannot take (e.g. lone surrogates)."""
        kept = []
        for number, values in documents:
            for value in values:
                texts = [value] if isinstance(value, str) else value
                try:
                    for text in texts:
                        text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    bad.append((number, f"text is not valid Unicode ({exc.reason})"))
                    break
            else:
                kept.append((number, values))
        return kept

    def _encode_key(self, values: list[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode one key of every document: ``(tokens, sequence_lengths, sequences_per_document)``."""
        sentences: list[str] = []
        counts = np.empty(len(values), dtype=np.int64)
        split = self.splitter.tokenize if self.splitter is not None else None
        for i, value in enumerate(values):
            texts = [value] if isinstance(value, str) else value
            if split is not None:
                texts = [sentence for text in texts for sentence in split(text)]
            sentences.extend(texts)
            counts[i] = len(texts)
        ids = self.tokenizer.encode_batch(sentences) if sentences else []
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tokens = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        del ids  # one huge line: do not hold its id list and its arrays at once
        # Megatron drops sentences without tokens; a document may end up with none.
        document_of = np.repeat(np.arange(len(values)), counts)
        keep = lengths > 0
        lengths, document_of = lengths[keep], document_of[keep]
        per_document = np.bincount(document_of, minlength=len(values)).astype(np.int64)
        if self.append_eod and lengths.size:
            last = (
                np.cumsum(per_document)[per_document > 0] - 1
            )  # last sequence of each non-empty doc
            ends = np.cumsum(lengths)[last]
            tokens = np.insert(tokens, ends, self.tokenizer.eod)
            lengths[last] += 1
        return (
            _as_token_array(tokens, self.dtype, "tokenizer output"),
            lengths.astype(np.int32),
            per_document,
        )


def _text_bytes(values: Sequence[Any], limit: int) -> int:
    """UTF-8 bytes of a row's texts, exact up to ``limit`` (encodes only where unsure)."""
    texts = [t for value in values for t in ([value] if isinstance(value, str) else value)]
    characters = sum(map(len, texts))
    if characters > limit or 4 * characters <= limit:  # a character is 1 to 4 bytes
        return characters
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)


_WORKER_ENCODER: ChunkEncoder | None = None  # set once per worker process by init_worker


def init_worker(encoder: ChunkEncoder) -> None:
    """Pool initializer: keep the encoder for this worker process, one core per worker.

    SIGTERM gets its default action back: ``Pool.terminate`` (how an error or an interrupt
    ends the pool) stops workers with it, and a forked worker
    would otherwise keep a handler of its parent's (a trainer's preemption handler, a
    test runner's) and could outlive the pool, waiting on a queue lock the pool holds.
    """
    global _WORKER_ENCODER
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # each worker is one process on one core
    _WORKER_ENCODER = encoder


def encode_in_worker(chunk: Chunk) -> EncodedChunk:
    """Pool task: encode a chunk with this worker's encoder."""
    assert _WORKER_ENCODER is not None, "init_worker was not called"
    return _WORKER_ENCODER(chunk)
