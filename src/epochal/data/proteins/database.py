"""BioNeMo's protein store: an SQLite database ``protein(id TEXT PRIMARY KEY, sequence TEXT)``.

:class:`ProteinSQLiteDataset` reads it as BioNeMo's class of the same name does
(bionemo-esm2 ``esm2/data/dataset.py``: ``dataset[id] -> sequence``, ``len`` = rows)
and differs where BioNeMo fails obscurely: a missing file is an error rather than
a new empty database (opened read-only), an unknown id raises ``KeyError`` naming
the id and the file, and the object pickles (the connection is reopened in each
process, so it works in spawned ``DataLoader`` workers).

The sequences must be what :func:`~epochal.data.proteins.sequences.clean_sequence`
stores (upper-case residues of the protein alphabet): a database of lower-case,
empty, numeric or NULL sequences would otherwise train on ``<unk>`` tokens or fail
mid-run. Opening checks, at a cost bounded by the number of rows (one ``SELECT``
over the stored types, which reads no sequence text), that every id and sequence is
text, and the content of :data:`SAMPLED_ROWS` rows spread over the table; every
sequence read later (:meth:`ProteinSQLiteDataset.__getitem__`) is checked too. Each
refusal is a :class:`~epochal.data.proteins.sequences.ProteinInputError` naming the
database and the row or id.

:func:`write_protein_database` builds such a database from protein records.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from epochal.data.proteins.readers import ProteinRecord
from epochal.data.proteins.sequences import PROTEIN_RESIDUES, ProteinInputError, check_sequence

__all__ = ["SAMPLED_ROWS", "ProteinSQLiteDataset", "missing_ids", "write_protein_database"]

_BATCH = 10_000
#: rows whose content opening a database checks (the first half, then evenly spread).
SAMPLED_ROWS = 256
#: characters of each sampled sequence that are checked at opening.
_SAMPLED_CHARS = 4096
_RULE = (
    f"a database holds upper-case residues {PROTEIN_RESIDUES}; convert FASTA or table "
    "files with data.protein_path, which cleans them"
)


class ProteinSQLiteDataset:
    """Protein sequences by id from BioNeMo's SQLite database.

    Args:
        db_path: the database (table ``protein`` with columns ``id``, ``sequence``).
        check: check the rows when opening (see the module docstring).

    Raises:
        ProteinInputError: the file is missing, not an SQLite database, has no
            ``protein`` table with ``id`` and ``sequence`` columns, holds no protein,
            or a row that is not text or not a protein (names the row and id).
    """

    def __init__(self, db_path: str | os.PathLike, *, check: bool = True) -> None:
        self.db_path = Path(db_path)
        if not self.db_path.is_file():
            raise ProteinInputError(f"{self.db_path}: protein database not found")
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._len: int | None = None
        try:
            columns = {row[1] for row in self._cursor().execute("PRAGMA table_info(protein)")}
        except sqlite3.DatabaseError as exc:
            raise ProteinInputError(f"{self.db_path}: not an SQLite database ({exc})") from exc
        if not {"id", "sequence"} <= columns:
            raise ProteinInputError(
                f"{self.db_path}: no table protein(id, sequence) "
                f"(found columns: {sorted(columns) or 'no protein table'})"
            )
        if check:
            self._check_rows()

    def _check_rows(self) -> None:
        """Refuse ids and sequences that are not text (every row), and bad content (a sample)."""
        cursor = self._cursor()
        bad = cursor.execute(
            "SELECT rowid, id, typeof(id), typeof(sequence) FROM protein "
            "WHERE typeof(id) != 'text' OR typeof(sequence) != 'text' LIMIT 1"
        ).fetchone()
        if bad is not None:
            rowid, idx, id_type, seq_type = bad
            what = f"id {idx!r} is {id_type}" if id_type != "text" else f"sequence is {seq_type}"
            raise ProteinInputError(
                f"{self.db_path}: row {rowid} (id {idx!r}): the {what}, not text "
                "(a protein database holds text ids and upper-case residue sequences)"
            )
        if len(self) == 0:
            raise ProteinInputError(f"{self.db_path}: the protein table holds no protein")
        for rowid, idx, text in self._sample(cursor):
            if not idx:
                raise ProteinInputError(f"{self.db_path}: row {rowid}: empty id")
            check_sequence(text, f"{self.db_path}: row {rowid} (id {idx!r})", rule=_RULE)

    def _sample(self, cursor: sqlite3.Cursor) -> list[tuple[int, str, str]]:
        """``(rowid, id, first characters)`` of :data:`SAMPLED_ROWS` rows spread over the table."""
        query = f"SELECT rowid, id, substr(sequence, 1, {_SAMPLED_CHARS}) FROM protein"
        half = SAMPLED_ROWS // 2
        rows = cursor.execute(f"{query} ORDER BY rowid LIMIT {half}").fetchall()
        if len(rows) < half:  # every row is in
            return rows
        try:
            low, high = cursor.execute("SELECT min(rowid), max(rowid) FROM protein").fetchone()
        except sqlite3.OperationalError:  # a table WITHOUT ROWID: its first rows only
            return rows
        seen = {row[0] for row in rows}
        for k in range(half):
            target = low + (high - low) * k // half
            (rowid,) = cursor.execute(
                "SELECT rowid FROM protein WHERE rowid >= ? ORDER BY rowid LIMIT 1", (target,)
            ).fetchone()
            if rowid not in seen:
                seen.add(rowid)
                rows.append(cursor.execute(f"{query} WHERE rowid = ?", (rowid,)).fetchone())
        return rows

    def _cursor(self) -> sqlite3.Cursor:
        if self._conn is None or self._pid != os.getpid():
            uri = f"{self.db_path.resolve().as_uri()}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._pid = os.getpid()
        return self._conn.cursor()

    def __getstate__(self) -> dict[str, Any]:
        return {"db_path": self.db_path, "_len": self._len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.db_path, self._len = state["db_path"], state["_len"]
        self._conn, self._pid = None, -1

    def __len__(self) -> int:
        """The number of proteins (rows of ``protein``)."""
        if self._len is None:
            self._len = int(self._cursor().execute("SELECT COUNT(*) FROM protein").fetchone()[0])
        return self._len

    def __getitem__(self, idx: str) -> str:
        """The sequence of protein ``idx`` (a UniRef90 id for training, UniRef50 for validation).

        Raises:
            TypeError: ``idx`` is not a string.
            KeyError: no protein has that id (names the id and the database).
            ProteinInputError: the stored sequence is empty or not upper-case residues.
        """
        if not isinstance(idx, str):
            raise TypeError(f"Expected string, got {type(idx)}: {idx}.")
        row = self._cursor().execute("SELECT sequence FROM protein WHERE id = ?", (idx,)).fetchone()
        if row is None:
            raise KeyError(f"{self.db_path}: no protein with id {idx!r}")
        if not isinstance(row[0], str):
            raise ProteinInputError(f"{self.db_path}: protein {idx!r}: the sequence is {row[0]!r}")
        check_sequence(row[0], f"{self.db_path}: protein {idx!r}", rule=_RULE)
        return row[0]

    def __contains__(self, idx: object) -> bool:
        if not isinstance(idx, str):
            return False
        cursor = self._cursor().execute("SELECT 1 FROM protein WHERE id = ?", (idx,))
        return cursor.fetchone() is not None


def missing_ids(db_path: str | os.PathLike, ids: Iterable[str]) -> list[str]:
    """The ids (in input order, each once) that are not in the database's ``protein`` table.

    Args:
        db_path: the SQLite database.
        ids: the ids to look up (any iterable of strings; checked in batches).

    Raises:
        ProteinInputError: the database cannot be opened (see :class:`ProteinSQLiteDataset`).
    """
    cursor = ProteinSQLiteDataset(db_path, check=False)._cursor()
    missing: dict[str, None] = {}
    batch: list[str] = []

    def flush() -> None:
        unique = list(dict.fromkeys(batch))
        marks = ",".join("?" * len(unique))
        found = {
            r[0] for r in cursor.execute(f"SELECT id FROM protein WHERE id IN ({marks})", unique)
        }
        missing.update((i, None) for i in unique if i not in found)
        batch.clear()

    for protein_id in ids:
        batch.append(str(protein_id))
        if len(batch) >= 900:  # SQLite's default limit of bound parameters is 999
            flush()
    if batch:
        flush()
    return list(missing)


def write_protein_database(
    records: Iterable[ProteinRecord], db_path: str | os.PathLike, *, overwrite: bool = False
) -> int:
    """Write proteins into a new SQLite database in BioNeMo's layout.

    Args:
        records: ``(id, sequence, where)`` records (e.g. from
            :func:`~epochal.data.proteins.readers.read_proteins`); ``where`` names the
            record in error messages.
        db_path: the database file to create (written to ``<db_path>.tmp``, then renamed).
        overwrite: replace an existing file (else it is an error).

    Returns:
        The number of proteins written.

    Raises:
        ProteinInputError: ``db_path`` exists (without ``overwrite``), or an id
            repeats (names both records).
    """
    db_path = Path(db_path)
    if db_path.exists() and not overwrite:
        raise ProteinInputError(f"{db_path}: exists; remove it or pass overwrite=True")
    tmp = db_path.with_name(db_path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    first_seen: dict[str, str] = {}
    conn = sqlite3.connect(tmp)
    try:
        conn.execute("CREATE TABLE protein (id TEXT PRIMARY KEY, sequence TEXT)")
        rows: list[tuple[str, str]] = []
        for protein_id, sequence, where in records:
            if protein_id in first_seen:
                raise ProteinInputError(
                    f"{where}: duplicate id {protein_id!r} (first at {first_seen[protein_id]})"
                )
            first_seen[protein_id] = where
            rows.append((protein_id, sequence))
            if len(rows) >= _BATCH:
                conn.executemany("INSERT INTO protein VALUES (?, ?)", rows)
                rows.clear()
        conn.executemany("INSERT INTO protein VALUES (?, ?)", rows)
        conn.commit()
    except BaseException:
        conn.close()
        tmp.unlink(missing_ok=True)
        raise
    conn.close()
    os.replace(tmp, db_path)
    return len(first_seen)
