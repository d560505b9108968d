"""Protein input files: FASTA (plain or gzipped), CSV/TSV/parquet tables, MMseqs2 cluster TSVs.

Every reader yields ``(id, sequence, where)`` records: the protein's identifier,
its sequence normalised by :func:`~epochal.data.proteins.sequences.clean_sequence`
(upper case, no whitespace, no final ``*``, checked against the alphabet and the
length limit), and its location (``file:line`` or ``file:row N``) for error
messages. Errors are :class:`~epochal.data.proteins.sequences.ProteinInputError`
naming the file and the line or row.

- FASTA: ``>ID description`` headers; the first word after ``>`` is the id; the
  sequence may span lines; ``;`` lines are comments. gzip is detected by its magic
  bytes and decompressed as the lines are read; a UTF-8 byte-order mark is skipped.
  A line, and a record's sequence, hold at most
  :func:`~epochal.data.proteins.sequences.max_protein_length` characters: the
  reader stops there (a 1 MB gzip expanding to a 1 GiB line, or ``/dev/zero``, is
  refused after reading that many characters).
- Tables: ``.csv``, ``.tsv``/``.tab`` (optionally ``.gz``) and ``.parquet``, read by
  :class:`~epochal.data.proteins.tables.TableReader` (trailing delimiters, encodings,
  bounds), with a sequence column (default ``sequence``) and an optional id column;
  without one the id is ``<file stem>_<row>`` (rows counted from 1).
- Clusters: an MMseqs2 ``createtsv``-style file, ``representative<TAB>member`` per
  line (the representative lists itself as a member).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from epochal.data.proteins.sequences import (
    ProteinInputError,
    clean_sequence,
    is_clean,
    max_protein_length,
    too_long,
)
from epochal.data.proteins.tables import TableReader, table_format
from epochal.data.proteins.text_lines import BoundedLines

__all__ = [
    "ProteinRecord",
    "read_fasta",
    "read_mmseqs_clusters",
    "read_protein_table",
    "read_proteins",
]

#: ``(id, sequence, where)``: one protein and its location in its file.
ProteinRecord = tuple[str, str, str]
_BLOCK = 4096  # lines joined at a time while a long record is read


def read_fasta(path: str | os.PathLike) -> Iterator[ProteinRecord]:
    """Yield the proteins of a FASTA file (plain or gzipped).

    Args:
        path: the file; the first word of each ``>`` header is the protein's id.

    Yields:
        ``(id, sequence, "file:line (>id)")`` with the header's line number (from 1).

    Raises:
        ProteinInputError: the file cannot be read or is not UTF-8, residues before
            the first header, a header without an id, an empty sequence, characters
            outside the alphabet, a line or sequence over the length limit (the
            message names the file, line and characters or limit).
    """
    path = Path(path)
    limit = max_protein_length()
    header_id: str | None = None
    header_line = 0
    chunks: list[str] = []  # the record's lines since the last block
    blocks: list[str] = []  # its earlier lines, joined _BLOCK at a time
    size = 0
    clean = True  # every line so far holds only upper-case residues

    def where() -> str:
        return f"{path}:{header_line} (>{header_id})"

    def record() -> ProteinRecord:
        text = "".join(blocks + chunks)  # (one line: the same string, not a copy)
        blocks.clear()
        chunks.clear()
        if not (clean and text):
            text = clean_sequence(text, where())
        return header_id, text, where()  # type: ignore[return-value]

    for line_number, line in BoundedLines(path, limit, ProteinInputError):
        if line.startswith(">"):
            if header_id is not None:
                yield record()
            words = line[1:].split()
            if not words:
                raise ProteinInputError(f"{path}:{line_number}: a '>' header without an id")
            header_id, header_line, size, clean = words[0], line_number, 0, True
        elif line.strip() and not line.startswith(";"):
            if header_id is None:
                raise ProteinInputError(
                    f"{path}:{line_number}: sequence before the first '>' header "
                    "(is this a FASTA file?)"
                )
            size += len(line)
            clean = clean and is_clean(line)
            if size > limit + (0 if clean else 1):  # (+1: a final '*' is not a residue)
                raise ProteinInputError(too_long(where(), "a sequence", limit))
            chunks.append(line)
            if len(chunks) >= _BLOCK:  # short lines: joined in blocks (less overhead)
                blocks.append("".join(chunks))
                chunks.clear()
    if header_id is None:
        raise ProteinInputError(f"{path}: no '>' header: not a FASTA file, or empty")
    yield record()


def read_protein_table(
    path: str | os.PathLike,
    sequence_column: str = "sequence",
    id_column: str | None = None,
) -> Iterator[ProteinRecord]:
    """Yield the proteins of a CSV, TSV or parquet table.

    Args:
        path: ``.csv``, ``.tsv``/``.tab`` (each optionally ``.gz``) or ``.parquet``.
        sequence_column: the column holding the sequences.
        id_column: the column holding the ids; None: ``<file stem>_<row>``.

    Yields:
        ``(id, sequence, "file:row N (id)")`` with data rows counted from 1.

    Raises:
        ProteinInputError: unknown suffix, unreadable file, a missing column (the
            columns found are listed), or a bad row (missing/empty sequence or id,
            characters outside the alphabet, a cell over the length limit).
    """
    path = Path(path)
    table = TableReader(path, ProteinInputError)
    columns = [sequence_column] + ([id_column] if id_column else [])
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ProteinInputError(
            f"{path}: no column {', '.join(map(repr, missing))} "
            f"(columns: {', '.join(map(str, table.columns))}); set the sequence/id column names"
        )
    stem = path.name.split(".")[0]
    for row, values in table.rows(columns):
        text = values[0]
        where = f"{path}:row {row}"
        if not isinstance(text, str):
            raise ProteinInputError(f"{where}: no sequence (got {text!r})")
        protein_id = f"{stem}_{row}" if not id_column else values[1]
        if not isinstance(protein_id, str) or not protein_id.strip():
            raise ProteinInputError(f"{where}: empty or missing id in column {id_column!r}")
        where = f"{where} ({protein_id.strip()})"
        yield protein_id.strip(), clean_sequence(text, where), where


def read_proteins(
    path: str | os.PathLike,
    sequence_column: str = "sequence",
    id_column: str | None = None,
) -> Iterator[ProteinRecord]:
    """Yield the proteins of a FASTA file or a table, chosen by the file's suffix.

    Tables are ``.csv``/``.tsv``/``.tab``/``.parquet`` (optionally ``.gz``); anything
    else is read as FASTA. The column arguments apply to tables only.

    Raises:
        ProteinInputError: see :func:`read_fasta` and :func:`read_protein_table`.
    """
    path = Path(path)
    if table_format(path) is not None:
        return read_protein_table(path, sequence_column, id_column)
    return read_fasta(path)


def read_mmseqs_clusters(path: str | os.PathLike) -> dict[str, list[str]]:
    """Read an MMseqs2 cluster TSV (``representative<TAB>member`` per line).

    Args:
        path: the TSV (plain or gzipped); blank lines are skipped.

    Returns:
        representative -> its members in file order (clusters in order of first
        appearance). A representative missing from its own member list is added first.

    Raises:
        ProteinInputError: no cluster at all, a line without exactly two tab-separated
            fields, an empty id, a member listed twice (in one or two clusters), a line
            over the length limit; names file and line.
    """
    path = Path(path)
    clusters: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    for line_number, line in BoundedLines(path, max_protein_length(), ProteinInputError):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 2 or not all(fields):
            raise ProteinInputError(
                f"{path}:{line_number}: expected 'representative<TAB>member', got {line.rstrip()!r}"
            )
        representative, member = fields
        if member in seen:
            raise ProteinInputError(
                f"{path}:{line_number}: member {member!r} was already listed on line "
                f"{seen[member]} (every sequence belongs to one cluster)"
            )
        seen[member] = line_number
        clusters.setdefault(representative, []).append(member)
    if not clusters:
        raise ProteinInputError(
            f"{path}: no clusters (an empty MMseqs2 TSV; expected 'representative<TAB>member' lines)"
        )
    for representative, members in clusters.items():
        if representative not in members:
            if representative in seen:
                raise ProteinInputError(
                    f"{path}: representative {representative!r} is a member of another cluster "
                    f"(line {seen[representative]})"
                )
            members.insert(0, representative)
    return clusters
