"""Protein input files: FASTA (plain or gzipped), CSV/TSV/parquet tables, MMseqs2 cluster TSVs.

Every reader yields ``(id, sequence, where)`` records: the protein's identifier,
its sequence normalised by :func:`~epochal.data.proteins.sequences.clean_sequence`
(upper case, no whitespace, no final ``*``), and its location (``file:line`` or
``file:row N``) for error messages. Errors are
:class:`~epochal.data.proteins.sequences.ProteinInputError` naming the file and
the line or row.

- FASTA: ``>ID description`` headers; the first word after ``>`` is the id; the
  sequence may span lines. ``.gz`` files (detected by their magic bytes) are
  decompressed on the fly.
- Tables: ``.csv``, ``.tsv``/``.tab`` (optionally ``.gz``) and ``.parquet``, with a
  sequence column (default ``sequence``) and an optional id column; without one the
  id is ``<file stem>_<row>`` (rows counted from 1).
- Clusters: an MMseqs2 ``createtsv``-style file, ``representative<TAB>member`` per
  line (the representative lists itself as a member).
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from epochal.data.proteins.sequences import ProteinInputError, clean_sequence

__all__ = [
    "ProteinRecord",
    "read_fasta",
    "read_mmseqs_clusters",
    "read_protein_table",
    "read_proteins",
]

#: ``(id, sequence, where)``: one protein and its location in its file.
ProteinRecord = tuple[str, str, str]

_TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t", ".tab": "\t", ".parquet": None}
_FASTA_SUFFIXES = {".fasta", ".fa", ".faa", ".fas", ".fna", ".fsa", ".seq"}


def _open_text(path: Path) -> IO[str]:
    """Open ``path`` for reading as UTF-8 text, gunzipping it when it starts with gzip's magic."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise ProteinInputError(f"{path}: cannot open ({exc.strerror or exc})") from exc
    if raw.peek(2)[:2] == b"\x1f\x8b":
        raw = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
    return io.TextIOWrapper(raw, encoding="utf-8", newline=None)


def read_fasta(path: str | os.PathLike) -> Iterator[ProteinRecord]:
    """Yield the proteins of a FASTA file (plain or gzipped).

    Args:
        path: the file; the first word of each ``>`` header is the protein's id.

    Yields:
        ``(id, sequence, "file:line")`` with the header's line number (from 1).

    Raises:
        ProteinInputError: the file cannot be read or decoded, residues before the
            first header, a header without an id, an empty sequence, characters
            outside the alphabet (the message names the file, line and characters).
    """
    path = Path(path)
    header_id: str | None = None
    header_line = 0
    chunks: list[str] = []

    def record() -> ProteinRecord:
        where = f"{path}:{header_line} (>{header_id})"
        return header_id, clean_sequence("".join(chunks), where), where  # type: ignore[return-value]

    line_number = 0
    try:
        with _open_text(path) as stream:
            for line_number, line in enumerate(stream, start=1):
                if line.startswith(">"):
                    if header_id is not None:
                        yield record()
                    words = line[1:].split()
                    if not words:
                        raise ProteinInputError(f"{path}:{line_number}: a '>' header without an id")
                    header_id, header_line, chunks = words[0], line_number, []
                elif line.strip() and not line.startswith(";"):
                    if header_id is None:
                        raise ProteinInputError(
                            f"{path}:{line_number}: sequence before the first '>' header "
                            "(is this a FASTA file?)"
                        )
                    chunks.append(line)
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ProteinInputError(f"{path}: cannot read line {line_number + 1} ({exc})") from exc
    if header_id is None:
        raise ProteinInputError(f"{path}: no '>' header: not a FASTA file, or empty")
    yield record()


def _table_format(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes and suffixes[-1] in _TABLE_SUFFIXES else None


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
        ``(id, sequence, "file:row N")`` with data rows counted from 1.

    Raises:
        ProteinInputError: unknown suffix, unreadable file, a missing column (the
            columns found are listed), or a bad row (missing/empty sequence or id,
            characters outside the alphabet).
    """
    import pandas as pd

    path = Path(path)
    kind = _table_format(path)
    if kind is None:
        raise ProteinInputError(
            f"{path}: unknown table format (expected .csv, .tsv, .tab or .parquet, optionally .gz)"
        )
    columns = [sequence_column] + ([id_column] if id_column else [])
    try:
        if kind == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_csv(path, sep=_TABLE_SUFFIXES[kind], dtype=str, keep_default_na=False)
    except Exception as exc:  # pandas/pyarrow raise many kinds
        raise ProteinInputError(f"{path}: cannot read the table ({exc})") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ProteinInputError(
            f"{path}: no column {', '.join(map(repr, missing))} "
            f"(columns: {', '.join(map(str, frame.columns))}); set the sequence/id column names"
        )
    stem = path.name.split(".")[0]
    ids = frame[id_column].tolist() if id_column else None
    for row, text in enumerate(frame[sequence_column].tolist(), start=1):
        where = f"{path}:row {row}"
        if not isinstance(text, str):
            raise ProteinInputError(f"{where}: no sequence (got {text!r})")
        protein_id = f"{stem}_{row}" if ids is None else ids[row - 1]
        if not isinstance(protein_id, str) or not protein_id.strip():
            raise ProteinInputError(f"{where}: empty or missing id in column {id_column!r}")
        protein_id = protein_id.strip()
        yield protein_id, clean_sequence(text, f"{where} ({protein_id})"), f"{where} ({protein_id})"


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
    if _table_format(path) is not None:
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
        ProteinInputError: a line without exactly two tab-separated fields, an empty
            id, or a member listed twice (in one or two clusters); names file and line.
    """
    path = Path(path)
    clusters: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    line_number = 0
    try:
        with _open_text(path) as stream:
            for line_number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                fields = [f.strip() for f in line.rstrip("\r\n").split("\t")]
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
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise ProteinInputError(f"{path}: cannot read line {line_number + 1} ({exc})") from exc
    for representative, members in clusters.items():
        if representative not in members:
            if representative in seen:
                raise ProteinInputError(
                    f"{path}: representative {representative!r} is a member of another cluster "
                    f"(line {seen[representative]})"
                )
            members.insert(0, representative)
    return clusters
