"""Chunks of preprocessing input: whole lines of a JSONL file, read one chunk at a time.

A *chunk* is about ``chunk_bytes`` of whole lines of one input file (or a list of
documents, or rows of a parquet/arrow file). :func:`read_chunks` reads JSONL files;
:mod:`~epochal.data.indexed.preprocess_arrow` produces the same chunks from arrow files;
:mod:`~epochal.data.indexed.preprocess_encoding` turns chunks into token arrays.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class PreprocessError(ValueError):
    """Bad preprocessing input; the message names the file (and line)."""


@dataclass
class Chunk:
    """Whole lines of one input file, or a list of documents.

    Attributes:
        file_index: index into the input file list (-1 for in-memory documents).
        first_line: 1-based line number of the first line in ``data``.
        data: raw bytes of whole lines, or a list of documents (str or list of str),
            or with ``columns`` a list of rows, each a tuple of one value per JSON key.
        too_long: line numbers over ``max_line_bytes`` (replaced by empty lines).
        columns: ``data`` holds rows of a parquet/arrow file (values checked like JSON
            values; ``first_line`` is then the 1-based row number).
    """

    file_index: int
    first_line: int
    data: bytes | list[Any]
    too_long: list[int] = field(default_factory=list)
    columns: bool = False


def line_too_long(path: str, line: int, max_line_bytes: int) -> str:
    """The message for a line over ``--max-line-bytes``."""
    return (
        f"{path}:{line}: line longer than --max-line-bytes={max_line_bytes:,} "
        "(raise --max-line-bytes, or --skip-bad-lines to skip it)"
    )


def read_chunks(
    path: str,
    file_index: int,
    chunk_bytes: int,
    max_line_bytes: int | None = None,
    skip_bad_lines: bool = False,
) -> Iterator[tuple[Chunk, int]]:
    """Yield ``(chunk, on-disk bytes consumed)`` of whole lines from a ``.jsonl[.gz]`` file.

    Memory: one chunk: ``chunk_bytes`` plus the rest of its last line, which is read
    only up to ``max_line_bytes``. A longer last line is an error, or with
    ``skip_bad_lines`` it is read past in 1 MiB pieces, replaced by an empty line
    and its number put in ``Chunk.too_long``. (Lines that lie wholly inside a chunk
    are checked by :class:`ChunkEncoder`.)

    Raises:
        PreprocessError: the file is a corrupt or truncated gzip file, or a line is
            longer than ``max_line_bytes`` (without ``skip_bad_lines``).
    """
    with open(path, "rb") as raw:
        stream: Any = gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw
        line = 1
        position = 0
        try:
            while True:
                block = stream.read(chunk_bytes)
                if not block:
                    break
                too_long = []
                if not block.endswith(b"\n"):
                    tail = block.rfind(b"\n") + 1  # start of the unfinished last line
                    if max_line_bytes is None:
                        block += stream.readline()
                    else:
                        block += stream.readline(max(max_line_bytes + 1 - (len(block) - tail), 1))
                        if len(block) - tail > max_line_bytes and not block.endswith(b"\n"):
                            number = line + block.count(b"\n", 0, tail)
                            if not skip_bad_lines:
                                raise PreprocessError(line_too_long(path, number, max_line_bytes))
                            while (piece := stream.readline(1 << 20)) and not piece.endswith(b"\n"):
                                pass
                            block = block[:tail] + b"\n"
                            too_long.append(number)
                consumed = raw.tell() - position
                position += consumed
                yield Chunk(file_index, line, block, too_long), consumed
                line += block.count(b"\n")
        except (gzip.BadGzipFile, EOFError, OSError) as exc:
            raise PreprocessError(f"{path}: cannot read ({exc})") from exc
