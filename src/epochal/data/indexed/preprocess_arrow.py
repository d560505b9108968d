"""Preprocessing input from Hugging Face datasets: ``save_to_disk`` folders, parquet, arrow.

``epochal preprocess --input`` reads, besides JSONL:

- a folder written by ``datasets.Dataset.save_to_disk`` (``state.json`` lists its
  ``.arrow`` files in row order; a ``DatasetDict`` folder is refused: give one split,
  e.g. ``folder/train``),
- ``.parquet`` files (read one record batch at a time),
- ``.arrow`` files (Arrow IPC stream, as ``datasets`` writes them, or IPC file/Feather v2),
  memory-mapped and read one record batch at a time,
- a dataset name (``owner/name``, ``owner/name:split``) already in the local Hugging
  Face hub cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``): the data files of its newest snapshot (of that split).
  Nothing is ever downloaded; a name not in the cache is an error.

Rows become the same documents as JSON lines with the same values (a string, or a list
of strings, per ``--json-keys`` column), so the output is byte for byte the JSONL path's.
Memory holds at most a few chunks of about ``chunk_bytes`` of text. ``pyarrow`` is
imported only when such an input is given (``pip install epochal[hf]``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from epochal.data.indexed.preprocess_chunks import Chunk, PreprocessError

ARROW_SUFFIXES = (".parquet", ".arrow")
DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz") + ARROW_SUFFIXES
_SPLIT_NAMES = frozenset({"train", "test", "validation", "valid", "dev", "eval"})
_ROWS_PER_READ = 1024  # parquet rows per record batch before slicing to chunk_bytes


def is_arrow_file(path: str) -> bool:
    """Whether ``path`` names a parquet or arrow file (by suffix)."""
    return path.endswith(ARROW_SUFFIXES)


def saved_dataset_files(folder: str) -> list[str] | None:
    """The ``.arrow`` files of a ``save_to_disk`` folder in row order, or ``None`` if it is not one.

    Raises:
        PreprocessError: a ``DatasetDict`` folder (names its splits), an unreadable
            ``state.json``, or a dataset of 0 rows (``save_to_disk`` of an empty dataset
            writes no ``.arrow`` file; the message names the folder, split and columns).
    """
    dict_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(dict_file):
        try:
            with open(dict_file, encoding="utf-8") as stream:
                splits = json.load(stream).get("splits", [])
        except (OSError, ValueError, AttributeError) as exc:
            raise PreprocessError(f"{dict_file}: cannot read ({exc})") from exc
        raise PreprocessError(
            f"input {folder} is a DatasetDict with splits {splits}; give one split folder, "
            f"e.g. {os.path.join(folder, splits[0] if splits else 'train')}"
        )
    state_file = os.path.join(folder, "state.json")
    if not os.path.isfile(state_file):
        return None
    try:
        with open(state_file, encoding="utf-8") as stream:
            state = json.load(stream)
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PreprocessError(f"{state_file}: not a datasets save_to_disk state ({exc})") from exc
    if not names:
        raise PreprocessError(empty_dataset_message(folder))
    files = [os.path.join(folder, name) for name in names]
    for path in files:
        if not os.path.isfile(path):
            raise PreprocessError(f"{state_file} lists {path}, which does not exist")
    return files


def is_saved_dataset(folder: str) -> bool:
    """Whether ``folder`` is one split written by ``save_to_disk`` (it has a ``state.json``)."""
    return os.path.isfile(os.path.join(folder, "state.json"))


def empty_dataset_message(folder: str) -> str:
    """The error for a ``save_to_disk`` dataset of 0 rows: its folder, split and columns.

    The split is ``state.json``'s, else the folder's name when the folder above is a
    ``DatasetDict`` listing it (``datasets`` records no split for those).
    """
    split, columns = None, None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(folder, "state.json"), encoding="utf-8") as stream:
            split = json.load(stream).get("_split")
    parent, name = os.path.split(os.path.normpath(folder))
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        with open(os.path.join(parent, "dataset_dict.json"), encoding="utf-8") as stream:
            if not split and name in json.load(stream).get("splits", []):
                split = name
    with contextlib.suppress(OSError, ValueError, AttributeError):
        with open(os.path.join(folder, "dataset_info.json"), encoding="utf-8") as stream:
            columns = list(json.load(stream).get("features") or {})
    what = [f"split {split!r}" if split else "no split name"]
    if columns is not None:
        what.append(f"columns {columns}")
    return (
        f"input {folder}: the save_to_disk dataset at {folder} has 0 rows ({', '.join(what)}); "
        "nothing to preprocess, no output written: give a dataset with rows (check the "
        "filter or split that produced it)"
    )


def hub_cache_dir() -> str:
    """The Hugging Face hub cache folder (``HF_HUB_CACHE``, ``HF_HOME/hub`` or the default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return os.path.join(home, "hub")


def is_dataset_name(item: str) -> bool:
    """``name``, ``owner/name``, optionally ``:split``, as on the hub (not a path-looking string)."""
    name, _, split = item.partition(":")
    parts = name.split("/")
    return (
        len(parts) <= 2
        and not name.startswith((".", "~"))
        and not name.endswith(DATA_SUFFIXES)
        and all(part and all(c.isalnum() or c in "-_." for c in part) for part in parts)
        and all(c.isalnum() or c in "-_." for c in split)
    )


def cached_dataset_files(item: str) -> list[str]:
    """The data files of hub dataset ``name[:split]`` in the local cache; never touches the network.

    The newest snapshot of ``datasets--owner--name`` in :func:`hub_cache_dir` is searched
    for ``.parquet``/``.arrow``/``.jsonl[.gz]``/``.json[.gz]`` files, sorted by path. A
    ``split`` keeps the files named ``split-*``/``split.*`` or under a ``split`` folder
    (the hub's layouts); without one, a snapshot holding several splits is refused.

    Raises:
        FileNotFoundError: the dataset (or the split) is not in the local cache; the
            message says so and how to provide the data.
        PreprocessError: several splits cached and none chosen.
    """
    name, _, split = item.partition(":")
    cache = hub_cache_dir()
    snapshots = os.path.join(cache, "datasets--" + name.replace("/", "--"), "snapshots")
    found = []
    if os.path.isdir(snapshots):
        found = [os.path.join(snapshots, entry) for entry in os.listdir(snapshots)]
        found = [path for path in found if os.path.isdir(path)]
    if not found:
        raise FileNotFoundError(
            f"input {item} is not a file, directory or glob, and no Hugging Face dataset named "
            f"{name!r} is in the local cache ({cache}); epochal downloads nothing: save it "
            f"first, e.g. datasets.load_dataset({name!r}, split='train').save_to_disk(DIR), "
            "and give DIR"
        )
    snapshot = max(found, key=os.path.getmtime)
    files = sorted(
        os.path.relpath(os.path.join(root, file), snapshot)
        for root, _, names in os.walk(snapshot, followlinks=True)
        for file in names
        if file.endswith(DATA_SUFFIXES)
    )
    by_split: dict[str, list[str]] = {}
    for path in files:
        by_split.setdefault(_split_of(path), []).append(path)
    if split:
        chosen = by_split.get(split, [])
        if not chosen:
            raise FileNotFoundError(
                f"input {item}: the cached snapshot {snapshot} has no files of split {split!r} "
                f"(its splits: {sorted(by_split)}); epochal downloads nothing"
            )
    else:
        named = sorted(key for key in by_split if key)
        if len(named) > 1:
            raise PreprocessError(
                f"input {item}: the cached dataset has splits {named}; choose one as "
                f"{name}:{named[0]}"
            )
        chosen = files
    return [os.path.join(snapshot, path) for path in chosen]


def _split_of(relative: str) -> str:
    """The split a hub data file belongs to (``train-0000-of-0001.parquet``, ``train/x.parquet``,
    ``train.jsonl``), or ``""``."""
    parts = relative.split(os.sep)
    for part in parts[:-1]:
        if part in _SPLIT_NAMES:
            return part
    stem = parts[-1]
    for separator in ("-", ".", "_"):
        head = stem.split(separator, 1)[0]
        if head in _SPLIT_NAMES:
            return head
    return ""


def read_arrow_chunks(
    path: str,
    file_index: int,
    keys: Sequence[str],
    chunk_bytes: int,
) -> Iterator[tuple[Chunk, int]]:
    """Yield ``(chunk, file bytes consumed)`` of rows of a parquet or arrow file.

    Each chunk's ``data`` holds one tuple per row: the ``keys`` columns' values (``None``
    for a null, reported as a bad row by the encoder); ``first_line`` is the 1-based row
    number. Memory: one record batch plus one chunk of about ``chunk_bytes``.

    Raises:
        PreprocessError: the file cannot be read as parquet/arrow, or lacks a ``keys`` column.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PreprocessError(
            f"{path}: reading parquet/arrow needs pyarrow (pip install 'epochal[hf]')"
        ) from exc
    size = os.path.getsize(path)
    try:
        with pa.OSFile(path, "rb") as source:  # plain reads: a batch is freed once used
            row = 1
            reported = 0
            batch_start = 0
            for batch, batch_end in _batches(path, source, keys, size, pa, pq):
                for offset, step in _pieces(batch, chunk_bytes, pa):
                    piece = batch.slice(offset, step)
                    columns = [column.to_pylist() for column in piece.columns]
                    rows = list(zip(*columns))
                    done = offset + len(rows)
                    position = batch_start + (batch_end - batch_start) * done // batch.num_rows
                    yield Chunk(file_index, row, rows, columns=True), position - reported
                    reported = position
                    row += len(rows)
                batch_start = batch_end
            if reported < size:  # footer and empty batches: the bar ends at the file size
                yield Chunk(file_index, row, [], columns=True), size - reported
    except (pa.ArrowException, OSError) as exc:
        raise PreprocessError(f"{path}: cannot read as {_kind(path)} ({exc})") from exc


def _pieces(batch: Any, chunk_bytes: int, pa: Any) -> Iterator[tuple[int, int]]:
    """``(offset, rows)`` cutting ``batch`` into runs of rows of about ``chunk_bytes`` of text
    each (a run ends with the row that reaches it, like a JSONL chunk's last line)."""
    import numpy as np
    import pyarrow.compute as pc

    sizes = np.ones(batch.num_rows, dtype=np.int64)  # a row costs at least a byte
    for column in batch.columns:
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            flat = pc.binary_length(column.flatten()).fill_null(0).to_numpy(zero_copy_only=False)
            ends = np.concatenate([[0], np.cumsum(flat, dtype=np.int64)])
            offsets = np.asarray(column.offsets, dtype=np.int64)
            offsets -= offsets[0]
            sizes += ends[offsets[1:]] - ends[offsets[:-1]]
        elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            sizes += pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    cumulative = np.cumsum(sizes)
    offset = 0
    while offset < batch.num_rows:
        before = int(cumulative[offset - 1]) if offset else 0
        end = int(np.searchsorted(cumulative, before + chunk_bytes, side="left")) + 1
        end = min(max(end, offset + 1), batch.num_rows)
        yield offset, end - offset
        offset = end


def _batches(
    path: str, source: Any, keys: Sequence[str], size: int, pa: Any, pq: Any
) -> Iterator[tuple[Any, int]]:
    """Yield ``(record batch of the keys columns, file position after it)``, one at a time."""
    if path.endswith(".parquet"):
        parquet = pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False)  # page by page
        _check_columns(path, parquet.schema_arrow.names, keys)
        total = max(parquet.metadata.num_rows, 1)
        done = 0
        for batch in parquet.iter_batches(batch_size=_ROWS_PER_READ, columns=list(keys)):
            done += batch.num_rows
            yield batch, size * done // total
        return
    try:
        stream = pa.ipc.open_stream(source)  # what datasets writes
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_file(source)  # IPC file / Feather v2
        _check_columns(path, reader.schema.names, keys)
        count = reader.num_record_batches
        for index in range(count):
            yield reader.get_batch(index).select(list(keys)), size * (index + 1) // count
        return
    _check_columns(path, stream.schema.names, keys)
    for batch in stream:
        yield batch.select(list(keys)), min(source.tell(), size)


def _kind(path: str) -> str:
    return "parquet" if path.endswith(".parquet") else "arrow"


def _check_columns(path: str, names: Sequence[str], keys: Sequence[str]) -> None:
    missing = [key for key in keys if key not in names]
    if missing:
        raise PreprocessError(
            f"{path}: no column {missing[0]!r} (--json-keys); its columns are {list(names)}"
        )
