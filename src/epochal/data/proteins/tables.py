"""CSV / TSV / parquet tables of proteins, read within bounds: one reader for every table.

Pretraining tables (:func:`~epochal.data.proteins.readers.read_protein_table`), the
input tables of ``epochal embed`` and fine-tuning tables
(:mod:`epochal.data.datasets.labelled`) are all read here, with these rules:

- format by suffix: ``.csv`` (comma), ``.tsv`` / ``.tab`` (tab), each optionally
  gzipped (``.csv.gz``; gzip is recognised by its content), and ``.parquet``;
- text tables are UTF-8 (a byte-order mark is skipped; other encodings are refused
  naming the file, line and byte) and follow the ``csv`` module's quoting (cells
  holding the delimiter, quotes or line breaks are quoted);
- the first non-empty line is the header; column names are stripped of spaces;
  empty lines are skipped; data rows are numbered from 1 (the header not counted);
- a trailing delimiter never shifts columns: empty cells after the header's last
  column (``MKTAYIAKQR,a,`` under ``sequence,id``) and an empty last header name are
  dropped; a row with more non-empty cells than the header, or fewer cells, is
  refused naming the row;
- bounds: a cell holds at most ``limit`` characters (default
  :func:`~epochal.data.proteins.sequences.max_protein_length`), a row at most one
  ``limit`` per column, the header line at most ``limit``; parquet row groups whose
  columns are larger than ``limit`` per row are refused before they are read, and
  every value is checked.

Errors are the caller's exception class with the file (and line or row) named.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from epochal.data.proteins.sequences import max_protein_length, too_long
from epochal.data.proteins.text_lines import BoundedLines

__all__ = ["TABLE_DELIMITERS", "TableReader", "table_format"]

#: table suffix -> delimiter (None: parquet).
TABLE_DELIMITERS: dict[str, str | None] = {
    ".csv": ",",
    ".tsv": "\t",
    ".tab": "\t",
    ".parquet": None,
}


def table_format(
    path: str | os.PathLike, suffixes: dict[str, str | None] | None = None
) -> str | None:
    """The table suffix of ``path`` (``.gz`` ignored for text tables), or None when it is no table.

    Args:
        path: the file name.
        suffixes: the accepted suffixes (default :data:`TABLE_DELIMITERS`).
    """
    known = TABLE_DELIMITERS if suffixes is None else suffixes
    parts = [s.lower() for s in Path(path).suffixes]
    if parts and parts[-1] == ".gz":
        parts = parts[:-1]
        if parts and known.get(parts[-1], "") is None:  # no gzipped parquet
            return None
    return parts[-1] if parts and parts[-1] in known else None


class TableReader:
    """A table's header, then its rows (see the module docstring).

    Args:
        path: the table.
        error: the exception class raised (the caller's).
        suffixes: the accepted suffixes and their delimiters (default :data:`TABLE_DELIMITERS`).
        limit: the longest cell in characters (default ``max_protein_length()``).

    Attributes:
        columns: the column names, in order.

    Raises:
        error: an unknown suffix, an unreadable file, an empty file, a header that is
            over the limit or repeats a name.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        error: type[ValueError],
        *,
        suffixes: dict[str, str | None] | None = None,
        limit: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.error = error
        self.limit = max_protein_length() if limit is None else int(limit)
        known = TABLE_DELIMITERS if suffixes is None else suffixes
        kind = table_format(self.path, known)
        if kind is None:
            names = ", ".join(known)
            raise error(
                f"{self.path}: unknown table format (expected {names}; text tables may be .gz)"
            )
        self.delimiter = known[kind]
        if self.delimiter is None:
            self._parquet = self._open_parquet()
            self.columns = list(self._parquet.schema_arrow.names)
        else:
            self._lines = BoundedLines(self.path, self.limit, error)
            self._line_iter = iter(self._lines)
            self._reader = csv.reader(self._text(), delimiter=self.delimiter)
            self.columns = self._header()
        if len(set(self.columns)) != len(self.columns):
            twice = sorted({c for c in self.columns if self.columns.count(c) > 1})
            raise error(f"{self.path}: the header names column(s) {twice} more than once")

    # ------------------------------------------------------------------ text tables
    def _text(self) -> Iterator[str]:
        for _, line in self._line_iter:
            yield line + "\n"

    def _next_row(self) -> list[str] | None:
        """The next non-blank csv row, or None at the end (the cell bound set around the read)."""
        previous = csv.field_size_limit(self.limit)
        try:
            while True:
                row = next(self._reader, None)
                if row is None or row:
                    return row  # (empty lines are skipped)
        except csv.Error as exc:
            line = self._lines.line_number
            if "field larger than field limit" in str(exc):
                raise self.error(too_long(f"{self.path}:{line}", "a cell", self.limit)) from None
            raise self.error(f"{self.path}:{line}: not a well-formed table row ({exc})") from None
        finally:
            csv.field_size_limit(previous)

    def _header(self) -> list[str]:
        header = self._next_row()
        if header is None:
            raise self.error(f"{self.path}: empty file (no header row)")
        names = [h.strip() for h in header]
        while names and not names[-1]:  # a trailing delimiter on the header line
            names.pop()
        # a row holds one cell per column, each within the bound (quotes and delimiters aside)
        self._lines.limit = max(1, len(names)) * (self.limit + 3)
        self._lines.what = f"a row ({self.limit:,} characters per cell, {len(names)} columns) is"
        return names

    def _text_rows(self, indices: list[int]) -> Iterator[tuple[int, list[Any]]]:
        width = len(self.columns)
        number = 0
        while (row := self._next_row()) is not None:
            number += 1
            if len(row) > width and not any(c.strip() for c in row[width:]):
                row = row[:width]  # trailing delimiters
            if len(row) != width:
                raise self.error(
                    f"{self.path}: row {number} (line {self._lines.line_number}) has {len(row)} "
                    f"cells, the header {width} ({', '.join(self.columns)}); quote cells that "
                    "hold the delimiter"
                )
            yield number, [row[i] for i in indices]

    # ------------------------------------------------------------------ parquet
    def _open_parquet(self) -> Any:
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - pyarrow is a dependency
            raise self.error(f"{self.path}: reading parquet needs pyarrow") from exc
        try:
            return pq.ParquetFile(self.path)
        except Exception as exc:  # pyarrow raises many kinds
            raise self.error(f"{self.path}: cannot read the parquet file ({exc})") from exc

    def _parquet_rows(self, selected: list[str]) -> Iterator[tuple[int, list[Any]]]:
        meta = self._parquet.metadata
        first = 1
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            for j in range(info.num_columns):
                column = info.column(j)
                if column.path_in_schema.split(".")[0] not in selected:
                    continue
                if column.total_uncompressed_size > info.num_rows * (self.limit + 8) + 65536:
                    where = f"{self.path}: rows {first}-{first + info.num_rows - 1}"
                    raise self.error(too_long(where, "a value", self.limit))
            first += info.num_rows
        number = 0
        try:
            batches = self._parquet.iter_batches(batch_size=4096, columns=selected)
            for batch in batches:
                columns = [batch.column(name).to_pylist() for name in selected]
                for values in zip(*columns):
                    number += 1
                    for value in values:
                        if isinstance(value, str | bytes) and len(value) > self.limit:
                            where = f"{self.path}: row {number}"
                            raise self.error(too_long(where, "a value", self.limit))
                    yield number, list(values)
        except (OSError, ValueError) as exc:
            if isinstance(exc, self.error):
                raise
            raise self.error(f"{self.path}: cannot read row {number + 1} ({exc})") from exc

    def rows(self, selected: list[str]) -> Iterator[tuple[int, list[Any]]]:
        """``(row number from 1, [the values of the selected columns])`` per data row.

        Text tables give strings; parquet gives the stored Python values (str, numbers,
        None, lists). ``selected`` must be names of :attr:`columns`.

        Raises:
            error: a malformed row, a cell over the limit, an unreadable file.
        """
        if self.delimiter is None:
            return self._parquet_rows(selected)
        return self._text_rows([self.columns.index(name) for name in selected])
