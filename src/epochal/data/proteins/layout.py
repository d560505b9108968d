"""BioNeMo's ESM-2 data layout: an SQLite protein database plus parquet cluster files.

- training clusters: a parquet with a ``ur90_id`` column, one UniRef50 cluster per
  row holding the list of its UniRef90 member ids;
- validation clusters: a parquet with a ``ur50_id`` column, one id per row (the
  cluster's representative, itself a protein of the database).

:func:`read_train_clusters` / :func:`read_valid_clusters` read them (with the
checks BioNeMo leaves to a crash at sample time: empty clusters, members missing
from the database). :func:`proteins_to_bionemo_layout` converts FASTA or table
files (and optionally an MMseqs2 cluster TSV) into this layout, so that every
input goes through one code path: without clusters each protein is its own cluster.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epochal._atomic import atomic_write
from epochal.data.proteins.database import missing_ids, write_protein_database
from epochal.data.proteins.readers import read_mmseqs_clusters, read_proteins
from epochal.data.proteins.sequences import ProteinInputError

__all__ = [
    "ProteinLayout",
    "check_cluster_members",
    "proteins_to_bionemo_layout",
    "read_train_clusters",
    "read_valid_clusters",
    "write_train_clusters",
    "write_valid_clusters",
]


@dataclass(frozen=True)
class ProteinLayout:
    """The files of one converted protein set (BioNeMo's layout).

    Attributes:
        database: the SQLite ``protein(id, sequence)`` database.
        train_clusters: the training parquet (``ur90_id``: list of ids per cluster).
        valid_clusters: the validation parquet (``ur50_id``), None without a split.
        num_proteins / num_train_clusters / num_valid_clusters: the counts written.
    """

    database: Path
    train_clusters: Path
    valid_clusters: Path | None
    num_proteins: int
    num_train_clusters: int
    num_valid_clusters: int


def _read_column(path: Path, column: str, kind: str, lists: bool) -> Any:
    """Column ``column`` of a cluster parquet, after checking its stored type and row count.

    ``lists``: the column must hold lists of strings (else strings).
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ProteinInputError(f"{path}: {kind} cluster file not found")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises many kinds
        raise ProteinInputError(f"{path}: cannot read the parquet file ({exc})") from exc
    if column not in schema.names:
        raise ProteinInputError(
            f"{path}: {kind} cluster file must contain a {column!r} column "
            f"(found: {', '.join(map(str, schema.names))})"
        )
    stored = schema.field(column).type
    ids = stored
    if lists:
        listed = pa.types.is_list(stored) or pa.types.is_large_list(stored)
        ids = stored.value_type if listed else None
    if ids is None or not (pa.types.is_string(ids) or pa.types.is_large_string(ids)):
        want = "lists of string ids" if lists else "string ids"
        raise ProteinInputError(
            f"{path}: column {column!r} holds {stored}, not {want} (protein ids are text)"
        )
    try:
        frame = pd.read_parquet(path, columns=[column])
    except Exception as exc:  # pyarrow raises many kinds
        raise ProteinInputError(f"{path}: cannot read the parquet file ({exc})") from exc
    if len(frame) == 0:
        raise ProteinInputError(f"{path}: no {kind} clusters (the file has no rows)")
    return frame[column]


def read_train_clusters(path: str | os.PathLike) -> Any:
    """The training clusters of a ``ur90_id`` parquet, as the pandas Series BioNeMo uses.

    Returns:
        ``pandas.Series``; row ``i`` is an array of the member ids of cluster ``i``.

    Raises:
        ProteinInputError: missing/unreadable file, no ``ur90_id`` column, a column that
            does not hold lists of string ids, no rows, a row that is not a list of
            ids, an empty cluster (names the row).
    """
    path = Path(path)
    clusters = _read_column(path, "ur90_id", "training", lists=True)
    for row, members in enumerate(clusters):
        if isinstance(members, str) or not hasattr(members, "__len__"):
            raise ProteinInputError(
                f"{path}: row {row} of 'ur90_id' is {members!r}, not a list of UniRef90 ids"
            )
        if len(members) == 0:
            raise ProteinInputError(f"{path}: row {row} of 'ur90_id' is an empty cluster")
    return clusters


def read_valid_clusters(path: str | os.PathLike) -> Any:
    """The validation clusters of a ``ur50_id`` parquet: a Series of one-id lists (BioNeMo's).

    Raises:
        ProteinInputError: missing/unreadable file, no ``ur50_id`` column, a column that
            does not hold string ids, no rows, an empty id (names the row).
    """
    path = Path(path)
    ids = _read_column(path, "ur50_id", "validation", lists=False)
    for row, value in enumerate(ids):
        if not isinstance(value, str) or not value:
            raise ProteinInputError(f"{path}: row {row} of 'ur50_id' is {value!r}, not an id")
    return ids.apply(lambda x: [x])


def check_cluster_members(
    clusters: Sequence[Sequence[str]], db_path: str | os.PathLike, source: str
) -> None:
    """Refuse clusters whose members are not all in the database.

    Args:
        clusters: member ids per cluster.
        db_path: the SQLite database.
        source: the cluster file's name for the message.

    Raises:
        ProteinInputError: names up to 5 missing ids, their count, the files.
    """
    missing = missing_ids(db_path, (m for members in clusters for m in members))
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise ProteinInputError(
            f"{source}: {len(missing)} cluster member(s) not in the database {db_path}: {shown}"
        )


def write_train_clusters(clusters: Sequence[Sequence[str]], path: str | os.PathLike) -> None:
    """Write training clusters as BioNeMo's parquet (``ur90_id``: list of strings per row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"ur90_id": pa.array([list(c) for c in clusters], pa.list_(pa.string()))})
    pq.write_table(table, path)


def write_valid_clusters(ids: Sequence[str], path: str | os.PathLike) -> None:
    """Write validation cluster ids as BioNeMo's parquet (``ur50_id``: one string per row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ur50_id": pa.array(list(ids), pa.string())}), path)


def proteins_to_bionemo_layout(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    clusters: str | os.PathLike | None = None,
    valid_fraction: float = 0.0,
    num_valid: int | None = None,
    seed: int = 0,
    sequence_column: str = "sequence",
    id_column: str | None = None,
    overwrite: bool = False,
    reuse: bool = True,
) -> ProteinLayout:
    """Convert protein files into BioNeMo's layout: ``proteins.sqlite``, ``train_clusters.parquet``
    and (with a split) ``valid_clusters.parquet`` in ``out_dir``.

    Args:
        inputs: FASTA (plain/gz) or table files (see
            :func:`~epochal.data.proteins.readers.read_proteins`); ids must be unique
            across all of them.
        out_dir: the output folder (created).
        clusters: an MMseqs2 TSV (``representative<TAB>member``); None: every protein
            is its own cluster. Proteins in no cluster are stored but never sampled.
        valid_fraction: fraction of clusters held out for validation (rounded, at
            least 1 when positive); their representatives (first members) become the
            ``ur50_id`` rows. Ignored when ``num_valid`` is given.
        num_valid: number of clusters held out for validation.
        seed: picks the held-out clusters (``numpy.random.default_rng(seed)`` permutation).
        sequence_column / id_column: the table columns (see ``read_protein_table``).
        overwrite: replace existing output files.
        reuse: when ``out_dir`` holds a conversion of the same inputs (same paths,
            sizes and modification times) with the same options (``manifest.json``,
            written last), return it without converting again; a trainer can call
            this on every start.

    Returns:
        The :class:`ProteinLayout` written.

    Raises:
        ProteinInputError: a bad input record (names file and line/row), a duplicate
            id, a cluster member that is no input protein, a split that leaves no
            training cluster, existing outputs without ``overwrite``.
    """
    paths = [Path(inputs)] if isinstance(inputs, str | os.PathLike) else [Path(p) for p in inputs]
    if not paths:
        raise ProteinInputError("no protein input files given")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    database = out / "proteins.sqlite"
    train_path, valid_path = out / "train_clusters.parquet", out / "valid_clusters.parquet"
    options = dict(
        clusters=clusters, valid_fraction=valid_fraction, num_valid=num_valid, seed=seed,
        sequence_column=sequence_column, id_column=id_column,
    )  # fmt: skip
    manifest = _manifest([*paths, *([Path(clusters)] if clusters else [])], options)
    previous = _read_manifest(out / "manifest.json")
    if reuse and previous is not None and previous["source"] == manifest:
        return _layout(out, **previous["layout"])
    if previous is not None:
        if not overwrite:
            raise ProteinInputError(
                f"{out}: holds a conversion of other inputs or options; pass overwrite=True"
            )
        overwrite = True  # the old database goes too
    (out / "manifest.json").unlink(missing_ok=True)

    def records():
        for path in paths:
            yield from read_proteins(path, sequence_column, id_column)

    ids: list[str] = []

    def remembered():
        for record in records():
            if clusters is None:
                ids.append(record[0])
            yield record

    num_proteins = write_protein_database(remembered(), database, overwrite=overwrite)
    if clusters is None:
        groups = [[i] for i in ids]
    else:
        groups = list(read_mmseqs_clusters(clusters).values())
        check_cluster_members(groups, database, str(clusters))
    if not groups:
        raise ProteinInputError(f"{', '.join(map(str, paths))}: no proteins")
    if num_valid is None:
        if not 0.0 <= valid_fraction < 1.0:
            raise ProteinInputError(f"valid_fraction must be in [0, 1), got {valid_fraction}")
        num_valid = max(1, round(valid_fraction * len(groups))) if valid_fraction > 0 else 0
    if not 0 <= num_valid < len(groups):
        raise ProteinInputError(
            f"cannot hold out {num_valid} of {len(groups)} clusters for validation "
            "(at least one must remain for training)"
        )
    order = np.random.default_rng(seed).permutation(len(groups))
    held = set(order[:num_valid].tolist())
    write_train_clusters([g for i, g in enumerate(groups) if i not in held], train_path)
    if num_valid:
        write_valid_clusters([groups[i][0] for i in sorted(held)], valid_path)
    else:
        valid_path.unlink(missing_ok=True)
    counts = dict(
        num_proteins=num_proteins,
        num_train_clusters=len(groups) - num_valid,
        num_valid_clusters=num_valid,
    )
    atomic_write(
        out / "manifest.json", json.dumps({"source": manifest, "layout": counts}, indent=1)
    )
    return _layout(out, **counts)


def _layout(out: Path, **counts: int) -> ProteinLayout:
    valid = out / "valid_clusters.parquet" if counts["num_valid_clusters"] else None
    return ProteinLayout(out / "proteins.sqlite", out / "train_clusters.parquet", valid, **counts)


def _manifest(paths: list[Path], options: dict[str, Any]) -> dict[str, Any]:
    """What a conversion depends on: each input's resolved path, size and mtime, and the options."""
    files = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError as exc:
            raise ProteinInputError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        files.append([str(path.resolve()), stat.st_size, stat.st_mtime_ns])
    return {
        "files": files,
        "options": {k: None if v is None else str(v) for k, v in options.items()},
    }


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
