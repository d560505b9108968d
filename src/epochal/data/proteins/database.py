"""BioNeMo's protein store: an SQLite database ``protein(id TEXT PRIMARY KEY, sequence TEXT)``.

:class:`ProteinSQLiteDataset` reads it as BioNeMo's class of the same name does
(bionemo-esm2 ``esm2/data/dataset.py``: ``dataset[id] -> sequence``, ``len`` = rows)
and differs where BioNeMo fails obscurely: a missing file is an error rather than
a new empty database (opened read-only), an unknown id raises ``KeyError`` naming
the id and the file, and the object pickles (the connection is reopened in each
process, so it works in spawned ``DataLoader`` workers).

:func:`write_protein_database` builds such a database from protein records.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from epochal.data.proteins.readers import ProteinRecord
from epochal.data.proteins.sequences import ProteinInputError

__all__ = ["ProteinSQLiteDataset", "missing_ids", "write_protein_database"]

_BATCH = 10_000


class ProteinSQLiteDataset:
    """Protein sequences by id from BioNeMo's SQLite database.

    Args:
        db_path: the database (table ``protein`` with columns ``id``, ``sequence``).

    Raises:
        ProteinInputError: the file is missing, not an SQLite database, or has no
            ``protein`` table with ``id`` and ``sequence`` columns.
    """

    def __init__(self, db_path: str | os.PathLike) -> None:
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
        """
        if not isinstance(idx, str):
            raise TypeError(f"Expected string, got {type(idx)}: {idx}.")
        row = self._cursor().execute("SELECT sequence FROM protein WHERE id = ?", (idx,)).fetchone()
        if row is None:
            raise KeyError(f"{self.db_path}: no protein with id {idx!r}")
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
    cursor = ProteinSQLiteDataset(db_path)._cursor()
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
