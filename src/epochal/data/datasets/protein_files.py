"""Sequences of a protein file, in file order: FASTA (plain or gzipped) or a CSV / TSV / parquet table.

A minimal reader for ``epochal embed`` and fine-tuning inputs; the protein readers of
the ESM pretraining work (issue 23) are the fuller version and this module is meant
to delegate to them once they land. FASTA: ``>`` header lines (the id is the first
word), the sequence lines after it joined; a record without residues or a sequence
before the first header is an error naming the file and line. Tables:
:func:`epochal.data.datasets.labelled.read_sequence_table` (ids from ``id_column``,
else row numbers).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from epochal.data.datasets.labelled import LabelledDataError, read_sequence_table

__all__ = ["FASTA_SUFFIXES", "read_fasta", "read_sequences"]

FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")


def read_fasta(path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """``(ids, sequences)`` of a FASTA file (``.gz`` allowed), in file order.

    Raises:
        FileNotFoundError: no such file.
        LabelledDataError: a sequence line before any header, an empty record, no records.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such FASTA file")
    opener = gzip.open if path.suffix == ".gz" else open
    ids: list[str] = []
    chunks: list[list[str]] = []
    header_line = 0
    with opener(path, "rt", encoding="utf-8") as stream:
        for n, line in enumerate(stream, start=1):
            line = line.strip()
            if not line:
                continue
            if line.startswith(">"):
                if chunks and not chunks[-1]:
                    raise LabelledDataError(
                        f"{path}: line {header_line}: record {ids[-1]!r} has no residues"
                    )
                ids.append(line[1:].split()[0] if line[1:].split() else f"record{len(ids) + 1}")
                chunks.append([])
                header_line = n
            elif not chunks:
                raise LabelledDataError(f"{path}: line {n}: a sequence before the first '>' header")
            else:
                chunks[-1].append(line)
    if not ids:
        raise LabelledDataError(f"{path}: no FASTA records")
    if not chunks[-1]:
        raise LabelledDataError(f"{path}: line {header_line}: record {ids[-1]!r} has no residues")
    return ids, ["".join(c) for c in chunks]


def read_sequences(
    path: str | os.PathLike, sequence_column: str = "sequence", id_column: str | None = None
) -> tuple[list[str], list[str]]:
    """``(ids, sequences)`` of a FASTA file or a table (see the module docstring)."""
    p = Path(path)
    base = p.with_suffix("") if p.suffix == ".gz" else p
    if base.suffix.lower() in FASTA_SUFFIXES:
        return read_fasta(p)
    table = read_sequence_table(p, sequence_column, id_column=id_column)
    return table.ids, table.sequences
