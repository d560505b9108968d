"""Tokenize a fine-tuning file once: a cache of token stores keyed by everything the tokens depend on.

:func:`tokenized_rows` streams a file's rows through the tokenizer into a
:mod:`~epochal.data.sft.token_store` folder and maps it, so reading rows costs memory
for one row at a time and the memory maps, not the rows' Python objects (the rows of a
56 MB JSONL file took 0.6 GB in every process when held as objects:
``benchmarks/bench_sft_rows.py``).

The cache folder is ``<cache_dir>/<key>/``; ``key`` is a hash of:

- the file's bytes (SHA-256; a ``save_to_disk`` folder: every file's name and bytes)
  and how it is read (``.jsonl`` / ``.json`` / ``.parquet`` / folder);
- the tokenizer: its class, its ``tokenizer.json`` (the whole Rust tokenizer:
  vocabulary, merges, normalizer, pre- and post-processor, added tokens; a tokenizer
  without one: the files ``save_pretrained`` writes), its special tokens, its other
  settings, and its chat template;
- every option that changes the ids or masks: ``loss_on``, ``overlength`` and the
  length limit; and the versions of ``transformers``, ``tokenizers`` and ``jinja2``,
  which render templates and compute assistant masks.

A changed byte, tokenizer, template or option is a new key, so a stale store is never
read. A store is written into a temporary sibling folder and renamed into place when
complete (:func:`~epochal._atomic.atomic_directory`): a killed build leaves only a
``.tmp-*`` folder, which is never read (and can be deleted). A store that fails its
checks is rebuilt with a :class:`~epochal.data.datasets.index_cache.CacheRebuildWarning`.

Under ``torch.distributed`` (when initialized) rank 0 of ``group`` loads or builds the
store, the group meets at a barrier, and the other ranks map it; a rank that still
finds none (no shared file system) builds its own, with a warning. Every rank of the
group must therefore call this the same number of times, in the same order (as
:func:`~epochal.data.datasets.index_cache.cached_arrays`). With ``cache_dir=None`` the
store is built in a temporary folder and read into memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epochal._atomic import atomic_directory
from epochal.data.datasets.index_cache import CacheRebuildWarning, _group_rank, describe
from epochal.data.sft.rows import SFTDataError, check_rows_path, iter_sft_rows
from epochal.data.sft.token_store import StoreError, StoreWriter, TokenizedRows, open_store
from epochal.data.sft.tokenize import check_tokenize_options, limited_rows

__all__ = ["file_digest", "rows_identity", "tokenized_rows", "tokenizer_fingerprint"]

_CHUNK = 1 << 20


def _hash_file(path: str, h: Any) -> None:
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, or of a folder's files (relative names, sizes and bytes).

    Raises:
        FileNotFoundError / SFTDataError: as :func:`~epochal.data.sft.rows.check_rows_path`.
    """
    source = check_rows_path(path)
    h = hashlib.sha256()
    if not os.path.isdir(source):
        _hash_file(source, h)
        return h.hexdigest()
    for folder, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(folder, name)
            relative = os.path.relpath(full, source)
            h.update(f"{relative}\0{os.path.getsize(full)}\0".encode())
            _hash_file(full, h)
    return h.hexdigest()


def _reader(path: str) -> str:
    if os.path.isdir(path):
        return "save_to_disk"
    return os.path.splitext(path)[1].lstrip(".").lower()


def _simple(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


#: ``init_kwargs`` that say where or how a tokenizer was loaded, not how it tokenizes
_LOADING = ("name_or_path", "chat_template", "is_local", "local_files_only", "cache_dir")


def _setting(key: str) -> bool:
    """Whether an ``init_kwargs`` entry can change ids (not a path or a loading option)."""
    return key not in _LOADING and not key.endswith(("_file", "_files"))


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, Any]:
    """What a ``transformers`` tokenizer's ids and chat renderings depend on, as JSON-able values.

    The same for the same tokenizer files loaded in any process; see the module
    docstring for what it covers.
    """
    kind = type(tokenizer)
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    settings = getattr(tokenizer, "init_kwargs", {}) or {}
    out: dict[str, Any] = {
        "class": f"{kind.__module__}.{kind.__qualname__}",
        "size": len(tokenizer),
        "chat_template": getattr(tokenizer, "chat_template", None),
        "special_tokens": json.loads(json.dumps(special, sort_keys=True, default=str)),
        "settings": {k: v for k, v in sorted(settings.items()) if _simple(v) and _setting(k)},
    }
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        out["tokenizer_json"] = hashlib.sha256(backend.to_str().encode()).hexdigest()
        return out
    with tempfile.TemporaryDirectory() as folder:  # a tokenizer without a Rust backend
        tokenizer.save_pretrained(folder)
        out["files"] = {
            name: file_digest(os.path.join(folder, name)) for name in os.listdir(folder)
        }
    return out


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in ("transformers", "tokenizers", "jinja2"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def rows_identity(
    path: str | os.PathLike,
    tokenizer: Any,
    *,
    max_length: int | None,
    loss_on: str,
    overlength: str,
) -> dict[str, Any]:
    """Everything a file's token store depends on (hashed into its cache key)."""
    source = os.fspath(path)
    return {
        "rows": {"sha256": file_digest(source), "reader": _reader(source)},
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "options": {"loss_on": loss_on, "overlength": overlength, "max_length": max_length},
        "libraries": _versions(),
    }


def _build(folder: Path, source: str, tokenizer: Any, identity: dict, options: dict) -> None:
    writer = StoreWriter(folder, len(tokenizer))
    try:
        for limited in limited_rows(iter_sft_rows(source), tokenizer, **options):
            writer.add(limited)
        writer.finish(identity, options["max_length"])
    except BaseException:
        writer.abort()
        raise


def _load_or_build(
    cache: Path,
    source: str,
    tokenizer: Any,
    identity: dict,
    key: str,
    options: dict,
    log: Callable[[str], None] | None,
    why_missing: str | None = None,
) -> TokenizedRows:
    final = cache / key
    try:
        rows = open_store(final, source, identity=identity)
        if log is not None:
            log(f"sft rows of {source}: tokenized before, read from {final}")
        return rows
    except FileNotFoundError:
        if why_missing:
            warnings.warn(why_missing, CacheRebuildWarning, stacklevel=3)
    except StoreError as exc:
        warnings.warn(f"rebuilding tokenized rows: {exc}", CacheRebuildWarning, stacklevel=3)
    if log is not None:
        log(f"sft rows of {source}: tokenizing once into {final}")
    start = time.perf_counter()
    with atomic_directory(final, overwrite=True) as tmp:
        _build(tmp, source, tokenizer, identity, options)
    rows = open_store(final, source, identity=identity)
    if log is not None:
        log(
            f"sft rows of {source}: {rows.num_rows:,} rows tokenized in "
            f"{time.perf_counter() - start:.1f} s"
        )
    return rows


def _with_source(exc: SFTDataError, source: str) -> SFTDataError:
    if exc.source is None:
        exc.source = source
    return exc


def tokenized_rows(
    path: str | os.PathLike,
    tokenizer: Any,
    *,
    max_length: int | None = None,
    loss_on: str = "completion",
    overlength: str = "error",
    cache_dir: str | os.PathLike | None = None,
    group: Any = None,
    log: Callable[[str], None] | None = None,
) -> TokenizedRows:
    """The tokenized rows of a fine-tuning file, built once into the cache and mapped.

    Args:
        path: any file :func:`~epochal.data.sft.rows.read_sft_rows` reads.
        tokenizer / max_length / loss_on / overlength: as
            :func:`~epochal.data.sft.tokenize.tokenize_sft_rows`.
        cache_dir: the cache folder (one store a key inside); ``None`` builds in a
            temporary folder and reads the store into memory.
        group: ``torch.distributed`` group whose rank 0 builds; ``None`` is the default
            group when torch.distributed is initialized.
        log: ``log(str)`` for a line when rows are tokenized or found cached.

    Returns:
        :class:`~epochal.data.sft.token_store.TokenizedRows` of every row of the file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SFTDataError: every error of :func:`~epochal.data.sft.rows.iter_sft_rows` and
            :func:`~epochal.data.sft.tokenize.tokenize_sft_rows`, with ``source`` set to
            ``path``. No store is left for a file that failed.
        ValueError: an invalid ``loss_on``, ``overlength`` or ``max_length``.
        OSError: the cache folder cannot be written.
    """
    check_tokenize_options(loss_on, overlength, max_length)
    source = os.fspath(path)
    options = {"max_length": max_length, "loss_on": loss_on, "overlength": overlength}
    try:
        identity, key = describe(rows_identity(source, tokenizer, **options))
        if cache_dir is None:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp) / "rows"
                folder.mkdir()
                _build(folder, source, tokenizer, identity, options)
                return open_store(folder, source, identity=identity, mmap=False)
        cache = Path(cache_dir)
        rank, world = _group_rank(group)
        if world == 1:
            return _load_or_build(cache, source, tokenizer, identity, key, options, log)
        import torch.distributed as dist

        rows, failure = None, None
        if rank == 0:
            try:
                rows = _load_or_build(cache, source, tokenizer, identity, key, options, log)
            except BaseException as err:  # let the other ranks pass the barrier, then raise
                failure = err
        dist.barrier(group)
        if failure is not None:
            raise failure
        if rows is None:
            why = (
                f"rank {rank}: no tokenized rows from rank 0 in {cache} (rank 0 failed, or "
                "not a shared file system); tokenizing here"
            )
            rows = _load_or_build(cache, source, tokenizer, identity, key, options, log, why)
        return rows
    except SFTDataError as exc:
        raise _with_source(exc, source) from None
