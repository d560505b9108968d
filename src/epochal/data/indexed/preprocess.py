"""Tokenize text into Megatron indexed files (``.bin``/``.idx``), in parallel, in bounded memory.

Two entry points:

- :func:`preprocess`: JSONL files (``.jsonl``, ``.jsonl.gz``, directories, globs), or
  Hugging Face data (``save_to_disk`` folders, parquet, arrow; see
  :mod:`epochal.data.indexed.preprocess_arrow`) ->
  one ``{output_prefix}_{key}_document`` pair per JSON key (``_sentence`` with
  ``split_sentences``), like Megatron-LM's ``tools/preprocess_data.py`` (same output
  names, same ids, same document layout).
- :func:`preprocess_documents`: an iterable of strings -> one ``output_prefix`` pair.

Inputs are streamed in chunks of about ``chunk_bytes``; at most ``2 * workers + 2``
chunks are in flight, so memory does not grow with the input. Workers tokenize a whole
chunk in one batch call (the Rust tokenizers batch natively) and return compact arrays;
the main process writes them in input order, so the output does not depend on the
number of workers (sentence splitting happens in the workers, per document).

A run that would write no document (empty input, or every line bad and skipped) is
an error and leaves no output behind; lines longer than ``max_line_bytes`` (default
:data:`DEFAULT_MAX_LINE_BYTES`) are refused before they are read whole, since
tokenizing a line takes about 13-20 times its size in memory.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from epochal.data.indexed.indexed_builder import IndexedDatasetBuilder
from epochal.data.indexed.indexed_format import get_bin_path, normalize_dtype, optimal_dtype
from epochal.data.indexed.preprocess_arrow import (
    empty_dataset_message,
    is_arrow_file,
    is_saved_dataset,
    read_arrow_chunks,
)
from epochal.data.indexed.preprocess_chunks import Chunk, PreprocessError, read_chunks
from epochal.data.indexed.preprocess_encoding import (
    ChunkEncoder,
    EncodedChunk,
    encode_in_worker,
    find_input_files,
    init_worker,
)
from epochal.data.indexed.tokenizer import Tokenizer

__all__ = [
    "PreprocessError",
    "PreprocessSummary",
    "find_input_files",
    "preprocess",
    "preprocess_documents",
]

MAX_BAD_LINE_EXAMPLES = 20


class _NoDocument(PreprocessError):
    """Nothing to write because the inputs hold no document (no row, no line)."""


# Tokenizing one line takes about 13x its size in memory (GPT-2 BPE) to 20x (byte-level;
# measured on a 64 MiB line: 0.8 and 1.3 GB), so 32 MiB bounds a worker at about 0.4-0.7 GB.
DEFAULT_MAX_LINE_BYTES = 32 << 20


class _Enough(Exception):
    """Raised by the consumer when ``max_documents`` documents are written."""


@dataclass
class PreprocessSummary:
    """What a preprocessing run did.

    Attributes:
        outputs: JSON key -> output prefix (``preprocess_documents``: key ``"text"``).
        files: input files read (0 for in-memory documents).
        documents: documents written (per output; bad lines excluded).
        tokens: JSON key -> tokens written.
        bad_lines: lines skipped (``skip_bad_lines=True``).
        bad_line_examples: the first ``file:line: reason`` messages.
        input_bytes: bytes read from the input files (compressed size for ``.gz``).
        seconds: wall-clock time.
        dtype: token dtype of the outputs.
        sentence_splitter: the splitter used (``split_sentences``), e.g.
            ``SentenceSplitter(rules, english)``; empty without splitting.
        stopped_early: ``max_documents`` was reached before the end of the input.
    """

    outputs: dict[str, str]
    files: int = 0
    documents: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    bad_lines: int = 0
    bad_line_examples: list[str] = field(default_factory=list)
    input_bytes: int = 0
    seconds: float = 0.0
    dtype: str = ""
    sentence_splitter: str = ""
    stopped_early: bool = False

    @property
    def total_tokens(self) -> int:
        """Tokens over all outputs."""
        return sum(self.tokens.values())

    @property
    def documents_per_second(self) -> float:
        """Throughput in documents per second."""
        return self.documents / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Throughput in tokens (all outputs) per second."""
        return self.total_tokens / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        source = f" from {self.files} file{'s' if self.files != 1 else ''}" if self.files else ""
        skipped = f", {self.bad_lines:,} bad lines skipped" if self.bad_lines else ""
        outputs = ", ".join(f"{prefix}.{{bin,idx}}" for prefix in self.outputs.values())
        return (
            f"preprocessed {self.documents:,} documents, {self.total_tokens:,} tokens{source}{skipped} "
            f"in {self.seconds:.1f} s ({self.documents_per_second:,.0f} docs/s, "
            f"{self.tokens_per_second:,.0f} tokens/s, {self.dtype}) -> {outputs}"
        )


def preprocess(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    output_prefix: str | os.PathLike,
    tokenizer: Tokenizer,
    *,
    json_keys: Sequence[str] = ("text",),
    append_eod: bool = False,
    workers: int = 1,
    skip_bad_lines: bool = False,
    dtype: Any = None,
    chunk_bytes: int = 1 << 20,
    progress: bool = False,
    mp_context: str | None = None,
    split_sentences: bool = False,
    lang: str = "english",
    keep_newlines: bool = False,
    max_line_bytes: int | None = DEFAULT_MAX_LINE_BYTES,
    max_documents: int | None = None,
    log_interval: int | None = None,
) -> PreprocessSummary:
    """Tokenize JSONL files into one indexed dataset per JSON key.

    Each non-blank line is a JSON object; ``record[key]`` is a string (one sequence) or
    a list of strings (one sequence each, e.g. pre-split sentences). Sentences without
    tokens are dropped, and with ``append_eod`` the end-of-document id is appended to
    each document that has tokens — Megatron's rules, so the output equals Megatron's.
    With ``split_sentences`` each string is split into sentences first (one sequence
    each, the document boundary kept; see :mod:`epochal.data.indexed.sentence_split`).

    Args:
        inputs: ``.jsonl``/``.jsonl.gz``/``.parquet``/``.arrow`` files, ``save_to_disk``
            folders, directories, globs, cached hub dataset names (see :func:`find_input_files`).
        output_prefix: outputs are ``{output_prefix}_{key}_document.{bin,idx}``.
        tokenizer: any :class:`~epochal.data.tokenizer.Tokenizer`.
        json_keys: keys to tokenize, one output pair each.
        append_eod: append ``tokenizer.eod`` to every non-empty document.
        workers: processes that tokenize; ``<= 1`` tokenizes in this process.
        skip_bad_lines: skip (and count) lines that are not JSON objects with the keys,
            instead of failing on the first one.
        dtype: integer token dtype; default the smallest for ``tokenizer.vocab_size`` (uint16
            below 65500).
        chunk_bytes: bytes of input per work item (memory per in-flight chunk).
        progress: show a tqdm bar (bytes, documents/s, tokens/s) on stderr.
        mp_context: multiprocessing start method for the workers; default the platform's
            (``fork`` on Linux, as PyTorch's DataLoader and Megatron's tool use). ``spawn`` and
            ``forkserver`` need the calling script to guard its entry point with
            ``if __name__ == "__main__":``.
        split_sentences: one sequence per sentence (Megatron's ``--split-sentences``);
            outputs are then named ``{output_prefix}_{key}_sentence``.
        lang: the Punkt language (``--lang``) when nltk's data is installed.
        keep_newlines: keep the whitespace after each sentence (``--keep-newlines``).
        max_line_bytes: refuse lines longer than this (a bad line: an error, or skipped
            with ``skip_bad_lines``) before reading them whole; ``None``: no limit.
        max_documents: stop after this many documents (in input order).
        log_interval: print ``Processed N documents (docs/s, MB/s)`` to stderr each
            time another ``log_interval`` documents are written (Megatron's
            ``--log-interval``), checked once per chunk.

    Returns:
        A :class:`PreprocessSummary`; ``str(summary)`` is a one-line report.

    Raises:
        FileNotFoundError: an input matches no file (a dataset name: not in the local cache).
        PreprocessError: a bad line or row (``file:line: reason``) without ``skip_bad_lines``, an
            unreadable gzip file, or no document at all to write (empty input, or every
            line bad; a ``save_to_disk`` dataset of 0 rows is named with its split and
            columns). No output file is left behind on error.
        ValueError: a ``dtype`` that is not an integer dtype or does not hold the ids, a
            non-positive ``max_line_bytes``/``max_documents``/``log_interval``.
    """
    files = find_input_files(inputs)
    keys = list(json_keys)
    if not keys or len(set(keys)) != len(keys):
        raise ValueError(f"--json-keys must be distinct and non-empty, got {keys}")
    for option, value in (
        ("--max-line-bytes", max_line_bytes),
        ("--max-documents", max_documents),
        ("--log-interval", log_interval),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    prefix = os.fspath(output_prefix)
    level = "sentence" if split_sentences else "document"
    outputs = {key: f"{prefix}_{key}_{level}" for key in keys}
    total_bytes = sum(os.path.getsize(path) for path in files)
    splitter = _splitter(split_sentences, lang, keep_newlines)

    def chunks() -> Iterator[tuple[Chunk, int]]:
        for index, path in enumerate(files):
            if is_arrow_file(path):
                yield from read_arrow_chunks(path, index, keys, chunk_bytes)
            else:
                yield from read_chunks(path, index, chunk_bytes, max_line_bytes, skip_bad_lines)

    try:
        summary = _run(
            chunks(),
            files,
            outputs,
            tokenizer,
            keys,
            append_eod=append_eod,
            workers=workers,
            skip_bad_lines=skip_bad_lines,
            dtype=dtype,
            progress=progress,
            progress_total=total_bytes,
            mp_context=mp_context,
            splitter=splitter,
            max_line_bytes=max_line_bytes,
            max_documents=max_documents,
            log_interval=log_interval,
            where=", ".join(files)
            if len(files) <= 3
            else f"{files[0]} and {len(files) - 1} more files",
        )
    except _NoDocument:
        given = [os.fspath(item) for item in _as_list(inputs)]
        saved = [item for item in given if os.path.isdir(item) and is_saved_dataset(item)]
        if not saved:
            raise
        others = "; the other inputs hold no document either" if len(given) > 1 else ""
        raise PreprocessError(empty_dataset_message(saved[0]) + others) from None
    summary.files = len(files)
    return summary


def _as_list(inputs: Any) -> list[Any]:
    return [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)


def preprocess_documents(
    documents: Iterable[str | Sequence[str]],
    tokenizer: Tokenizer,
    output_prefix: str | os.PathLike,
    *,
    append_eod: bool = True,
    workers: int = 1,
    dtype: Any = None,
    chunk_bytes: int = 1 << 20,
    progress: bool = False,
    mp_context: str | None = None,
    split_sentences: bool = False,
    lang: str = "english",
    keep_newlines: bool = False,
) -> PreprocessSummary:
    """Tokenize documents given as strings into ``output_prefix.{bin,idx}``.

    Args:
        documents: any iterable of documents, each a string (one sequence) or a list of
            strings (one sequence each), e.g. a list, a generator or a ``datasets.Dataset``
            column (``ds["text"]``); consumed lazily in chunks.
        tokenizer: any :class:`~epochal.data.tokenizer.Tokenizer`.
        output_prefix: output path without extension.
        append_eod: append ``tokenizer.eod`` to every non-empty document.
        workers, dtype, chunk_bytes, progress, mp_context: as in :func:`preprocess`.
        split_sentences, lang, keep_newlines: as in :func:`preprocess` (the output
            name stays ``output_prefix``).

    Returns:
        A :class:`PreprocessSummary` with the single output under key ``"text"``.

    Raises:
        PreprocessError: a document is not a string or list of strings, or is not valid
            Unicode (named by its 0-based position).
        ValueError: a ``dtype`` that is not an integer dtype or does not hold the ids.
    """
    total = len(documents) if hasattr(documents, "__len__") else None  # type: ignore[arg-type]

    def chunks() -> Iterator[tuple[Chunk, int]]:
        batch: list[Any] = []
        size = 0
        start = 0
        for position, document in enumerate(documents):
            if not (
                isinstance(document, str)
                or (
                    isinstance(document, (list, tuple))
                    and all(isinstance(s, str) for s in document)
                )
            ):
                raise PreprocessError(
                    f"document {position} is {type(document).__name__}, expected a string or list of strings"
                )
            batch.append(document)
            size += len(document) if isinstance(document, str) else sum(map(len, document))
            if size >= chunk_bytes:
                yield Chunk(-1, start, batch), len(batch)
                start, batch, size = position + 1, [], 0
        if batch:
            yield Chunk(-1, start, batch), len(batch)

    return _run(
        chunks(),
        [],
        {"text": os.fspath(output_prefix)},
        tokenizer,
        ["text"],
        append_eod=append_eod,
        workers=workers,
        skip_bad_lines=False,
        dtype=dtype,
        progress=progress,
        progress_total=total,
        mp_context=mp_context,
        where="the documents given",
        splitter=_splitter(split_sentences, lang, keep_newlines),
    )


def _splitter(split_sentences: bool, lang: str, keep_newlines: bool) -> Any:
    """The sentence splitter for ``split_sentences``, or ``None``."""
    if not split_sentences:
        return None
    from epochal.data.indexed.sentence_split import SentenceSplitter

    return SentenceSplitter(lang, keep_newlines=keep_newlines)


def _run(
    chunks: Iterator[tuple[Chunk, int]],
    files: list[str],
    outputs: dict[str, str],
    tokenizer: Tokenizer,
    keys: list[str],
    *,
    append_eod: bool,
    workers: int,
    skip_bad_lines: bool,
    dtype: Any,
    progress: bool,
    progress_total: int | None,
    mp_context: str | None,
    where: str,
    splitter: Any = None,
    max_line_bytes: int | None = None,
    max_documents: int | None = None,
    log_interval: int | None = None,
) -> PreprocessSummary:
    from tqdm.auto import tqdm

    token_dtype = optimal_dtype(tokenizer.vocab_size) if dtype is None else normalize_dtype(dtype)
    if token_dtype.kind not in "iu":
        raise ValueError(f"dtype {token_dtype} (--dtype): token ids need an integer dtype")
    encoder = ChunkEncoder(tokenizer, keys, append_eod, token_dtype, splitter, max_line_bytes)
    summary = PreprocessSummary(
        outputs=dict(outputs),
        tokens=dict.fromkeys(keys, 0),
        dtype=str(token_dtype),
        sentence_splitter=repr(splitter) if splitter is not None else "",
    )
    logged = 0
    in_memory = not files
    started = time.perf_counter()
    with ExitStack() as stack:
        builders = [
            IndexedDatasetBuilder(get_bin_path(outputs[key]), dtype=token_dtype) for key in keys
        ]
        for builder in builders:
            stack.callback(builder.abort)  # no-op once finalized
        bar = stack.enter_context(
            tqdm(
                total=progress_total,
                disable=not progress,
                desc="preprocess",
                unit="docs" if in_memory else "B",
                unit_scale=True,
                unit_divisor=1000 if in_memory else 1024,
                dynamic_ncols=True,
            )
        )

        def consume(result: EncodedChunk, advance: int) -> None:
            if result.bad_lines:
                where = files[result.file_index] if result.file_index >= 0 else "document"
                messages = [f"{where}:{line}: {reason}" for line, reason in result.bad_lines]
                if not skip_bad_lines:
                    raise PreprocessError(
                        f"{messages[0]} (use --skip-bad-lines to skip such lines)"
                    )
                summary.bad_lines += len(messages)
                room = MAX_BAD_LINE_EXAMPLES - len(summary.bad_line_examples)
                summary.bad_line_examples.extend(messages[: max(room, 0)])
            documents = result.documents
            if max_documents is not None:
                documents = min(documents, max_documents - summary.documents)
            for key, builder, (tokens, lengths, per_document) in zip(
                keys, builders, result.outputs
            ):
                if documents < result.documents:  # keep the first `documents` only
                    per_document = per_document[:documents]
                    lengths = lengths[: int(per_document.sum())]
                    tokens = tokens[: int(lengths.sum())]
                builder.add_documents(tokens, lengths, per_document)
                summary.tokens[key] += int(tokens.size)
            summary.documents += documents
            summary.input_bytes += 0 if in_memory else advance
            bar.update(advance)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix_str(
                f"{summary.documents / elapsed:,.0f} docs/s, {summary.total_tokens / elapsed:,.0f} tokens/s",
                refresh=False,
            )
            nonlocal logged
            if log_interval and summary.documents // log_interval > logged:
                logged = summary.documents // log_interval
                print(
                    f"Processed {summary.documents} documents ({summary.documents / elapsed:,.1f} "
                    f"docs/s, {summary.input_bytes / elapsed / 2**20:,.2f} MB/s).",
                    file=sys.stderr,
                )
            if max_documents is not None and summary.documents >= max_documents:
                raise _Enough

        try:
            if workers <= 1:
                for chunk, advance in chunks:
                    consume(encoder(chunk), advance)
            else:
                _run_pool(chunks, encoder, workers, mp_context, consume)
        except _Enough:
            summary.stopped_early = True
        if summary.total_tokens == 0:
            skipped = f"{summary.bad_lines:,} bad lines skipped"
            if summary.documents:
                reason = f"all {summary.documents:,} documents are empty" + (
                    f" ({skipped})" if summary.bad_lines else ""
                )
            elif summary.bad_lines:
                reason = f"every line was bad ({skipped})"
            else:
                reason = "the input holds no document"
            error = _NoDocument if reason == "the input holds no document" else PreprocessError
            raise error(f"{where}: nothing to write: {reason}; no output written")
        for builder in builders:
            builder.finalize()
    summary.seconds = time.perf_counter() - started
    return summary


def _run_pool(
    chunks: Iterator[tuple[Chunk, int]],
    encoder: ChunkEncoder,
    workers: int,
    mp_context: str | None,
    consume: Callable[[EncodedChunk, int], None],
) -> None:
    """Encode chunks in a process pool, at most ``2 * workers + 2`` in flight, consumed in order.

    An early stop (``consume`` raising ``_Enough``) closes the pool instead of terminating
    it: the in-flight chunks are encoded and dropped, and the workers leave on the pool's
    own sentinels. ``Pool.terminate`` signals workers that may be writing a result; one
    killed while it holds the result queue's write lock leaves the pool's task handler
    waiting on that lock forever, and ``Pool.join`` with it. Only an error or an interrupt
    (where the in-flight work may never finish) terminates the pool.
    """
    context = multiprocessing.get_context(mp_context)
    pool = context.Pool(workers, initializer=init_worker, initargs=(encoder,))
    try:
        pending: deque[tuple[Any, int]] = deque()
        for chunk, advance in chunks:
            pending.append((pool.apply_async(encode_in_worker, (chunk,)), advance))
            if len(pending) >= 2 * workers + 2:
                result, advance = pending.popleft()
                consume(result.get(), advance)
        while pending:
            result, advance = pending.popleft()
            consume(result.get(), advance)
    except _Enough:
        pool.close()
        raise
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
