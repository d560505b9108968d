"""Cache of index arrays as ``.npy`` files named by a hash of what determines them.

A dataset that builds expensive index arrays (GPT document/sample/shuffle
indices, blend indices) describes everything its arrays depend on in a JSON-able
dict, the *identity*. :func:`cached_arrays` turns that into a file stem
``<hash>-<kind>-<split>``; the arrays are stored as ``<stem>-<name>.npy`` and a
``<stem>-description.json`` beside them says what they are (the identity, and each
array's shape and dtype). Numpy arrays in the identity are hashed by content, so a
corpus whose document lengths change never reuses a stale cache, and a different
configuration never matches a wrong one.

Rules:

- Every file is written to a unique temporary name and renamed into place, the
  description last, so concurrent builders (several jobs, or ranks without a
  shared file system) never expose a half-written file; a reader needs the
  description and every array, each with the shape, dtype and exact size the
  description states.
- A cache file that is truncated, unreadable or disagrees with the description is
  reported with a :class:`CacheRebuildWarning` and rebuilt.
- Under ``torch.distributed`` (when initialized), rank 0 of the group loads or
  builds and saves, the group meets at a barrier, then the other ranks load the
  files with ``mmap``; a rank that still finds no valid cache (no shared file
  system) builds and saves its own copy. Every rank of the group must therefore
  call this the same number of times, in the same order.
- With ``cache_dir=None`` nothing is written: the arrays are built in memory.
  With a cache, every rank (the builder too) serves read-only memory maps of the
  files, and datasets pickle them as file names (:func:`pickle_arrays`), so
  ``DataLoader`` workers map the same files instead of receiving copies.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from epochal._atomic import atomic_path, atomic_write

#: Bump when the index algorithms change so old caches are never reused.
CACHE_FORMAT_VERSION = 1


class CacheRebuildWarning(UserWarning):
    """A cached index file was missing parts or corrupted and is being rebuilt."""


def _canonical(obj: Any) -> Any:
    """Return a JSON-able form of ``obj``; numpy arrays become a content digest."""
    if isinstance(obj, np.ndarray):
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{obj.dtype.str}{obj.shape}".encode())
        digest.update(np.ascontiguousarray(obj).view(np.uint8).reshape(-1).data)
        return {"ndarray": digest.hexdigest(), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, Mapping):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_canonical(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot describe {type(obj).__name__} in a cache identity")


def describe(identity: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Return ``(canonical identity, hex hash)`` for a dataset identity.

    Args:
        identity: JSON-able values and numpy arrays (hashed by content).

    Returns:
        The canonical (JSON-able) identity and its 32-hex-digit blake2b hash.
    """
    canonical = {"cache_format_version": CACHE_FORMAT_VERSION, **_canonical(identity)}
    text = json.dumps(canonical, sort_keys=True)
    return canonical, hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _paths(cache_dir: str, stem: str, names: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    return (
        os.path.join(cache_dir, f"{stem}-description.json"),
        {name: os.path.join(cache_dir, f"{stem}-{name}.npy") for name in names},
    )


def _load(
    cache_dir: str, stem: str, names: tuple[str, ...], key: str
) -> dict[str, np.ndarray] | None:
    """Load the cached arrays; ``None`` when absent; raise ``ValueError`` when corrupted."""
    description_path, array_paths = _paths(cache_dir, stem, names)
    if not os.path.isfile(description_path):
        return None
    try:
        with open(description_path, encoding="utf-8") as handle:
            description = json.load(handle)
        expected = description["arrays"]
        if description["hash"] != key:
            raise ValueError("its hash does not match its name")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{description_path}: unreadable description ({err})") from err
    arrays = {}
    for name, path in array_paths.items():
        try:
            spec = expected[name]
            if tuple(spec["shape"]) and int(np.prod(spec["shape"])) == 0:
                array = np.load(path, allow_pickle=False)
            else:
                array = np.load(path, mmap_mode="r", allow_pickle=False)
                if os.path.getsize(path) != array.offset + array.nbytes:
                    raise ValueError("file size does not match its header")
            if list(array.shape) != list(spec["shape"]) or array.dtype.str != spec["dtype"]:
                raise ValueError(
                    f"holds {array.dtype.str}{list(array.shape)}, description says "
                    f"{spec['dtype']}{spec['shape']}"
                )
        except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
            raise ValueError(f"{path}: corrupted cache file ({err})") from err
        arrays[name] = array
    return arrays


def _save(
    cache_dir: str, stem: str, arrays: Mapping[str, np.ndarray], canonical: dict, key: str
) -> None:
    os.makedirs(cache_dir, exist_ok=True)
    description_path, array_paths = _paths(cache_dir, stem, tuple(arrays))
    for name, path in array_paths.items():
        with atomic_path(path) as tmp:
            np.save(tmp, arrays[name], allow_pickle=False)
    description = {
        "hash": key,
        "identity": canonical,
        "arrays": {
            name: {"shape": list(a.shape), "dtype": a.dtype.str} for name, a in arrays.items()
        },
    }
    atomic_write(description_path, json.dumps(description, indent=2, sort_keys=True))


def _load_or_build_here(
    cache_dir: str,
    stem: str,
    names: tuple[str, ...],
    key: str,
    canonical: dict,
    build: Callable[[], Mapping[str, np.ndarray]],
    why_missing: str | None = None,
) -> tuple[dict[str, np.ndarray], bool]:
    """Load a valid cache or build, save and return; second value says whether it was a hit."""
    try:
        arrays = _load(cache_dir, stem, names, key)
    except ValueError as err:
        warnings.warn(f"rebuilding cached indices: {err}", CacheRebuildWarning, stacklevel=4)
        arrays = None
    if arrays is not None:
        return arrays, True
    if why_missing:
        warnings.warn(why_missing, CacheRebuildWarning, stacklevel=4)
    built = dict(build())
    if set(built) != set(names):
        raise ValueError(f"index builder returned {sorted(built)}, expected {sorted(names)}")
    _save(cache_dir, stem, built, canonical, key)
    # serve the saved files, mapped like on every other rank (cheap to pickle, see below)
    return _load(cache_dir, stem, names, key) or built, False


def _group_rank(group: Any) -> tuple[int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch always ships it
        return 0, 1
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def cached_arrays(
    cache_dir: str | os.PathLike | None,
    kind: str,
    split: str,
    identity: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
    names: tuple[str, ...],
    build: Callable[[], Mapping[str, np.ndarray]],
    group: Any = None,
    note: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Return the arrays for ``identity``, from the cache when valid, else built (and saved).

    Args:
        cache_dir: folder of the cache; ``None`` builds in memory and writes nothing.
        kind: the dataset class name, part of the file names (e.g. ``"GPTDataset"``).
        split: split name, part of the file names (e.g. ``"train"``).
        identity: everything the arrays depend on (JSON-able values, numpy arrays),
            or a function returning it (called only when there is a cache to name).
        names: the array names ``build`` returns.
        build: builds the arrays (called on at most one rank of a synchronized group
            unless the cache cannot be seen by the others).
        group: ``torch.distributed`` process group whose rank 0 builds; ``None`` is the
            default group when torch.distributed is initialized.
        note: extra JSON-able facts for the description file (e.g. the data path);
            not part of the hash.

    Returns:
        ``(arrays, info)``; loaded arrays are read-only memory maps. ``info`` holds
        ``hash``, ``stem`` (both ``None`` without a cache), ``cache_hit`` (bool) and
        ``paths`` (name -> file, empty without a cache).

    Raises:
        OSError: if the cache folder cannot be written.
        ValueError: if ``build`` returns other names than ``names``.
    """
    names = tuple(names)
    if cache_dir is None:  # nothing to name: skip hashing the identity
        built = dict(build())
        return built, {"hash": None, "stem": None, "cache_hit": False, "paths": {}}
    if callable(identity):
        identity = identity()
    canonical, key = describe({"kind": kind, "split": split, **identity})
    canonical = {**canonical, "note": _canonical(dict(note or {}))}
    stem = f"{key}-{kind}-{split}"
    cache_dir = os.fspath(cache_dir)
    rank, world = _group_rank(group)
    if world == 1:
        arrays, hit = _load_or_build_here(cache_dir, stem, names, key, canonical, build)
    else:
        import torch.distributed as dist

        arrays, hit, failure = None, False, None
        if rank == 0:
            try:
                arrays, hit = _load_or_build_here(cache_dir, stem, names, key, canonical, build)
            except BaseException as err:  # let the other ranks pass the barrier, then re-raise
                failure = err
        dist.barrier(group)
        if failure is not None:
            raise failure
        if rank != 0:
            arrays, hit = _load_or_build_here(
                cache_dir,
                stem,
                names,
                key,
                canonical,
                build,
                why_missing=f"rank {rank}: no cache from rank 0 in {cache_dir} (not a shared "
                "file system?); building locally",
            )
    _, paths = _paths(cache_dir, stem, names)
    return arrays, {"hash": key, "stem": stem, "cache_hit": hit, "paths": paths}


class MappedFile(NamedTuple):
    """Stands for a memory-mapped cache array in a pickled dataset (see :func:`pickle_arrays`)."""

    path: str


def pickle_arrays(state: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Return ``state`` with each memory-mapped array in ``names`` replaced by its file.

    A dataset whose indices come from the cache then pickles in bytes, not in the size
    of its indices, when it is sent to ``DataLoader`` workers or other processes; the
    copy maps the same files again (:func:`unpickle_arrays`).
    """
    state = dict(state)
    for name in names:
        value = state.get(name)
        if isinstance(value, np.memmap) and value.filename and value.offset and value.mode == "r":
            state[name] = MappedFile(os.fspath(value.filename))
    return state


def unpickle_arrays(state: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Undo :func:`pickle_arrays`: map the files again (read-only)."""
    state = dict(state)
    for name in names:
        value = state.get(name)
        if isinstance(value, MappedFile):
            state[name] = np.load(value.path, mmap_mode="r", allow_pickle=False)
    return state
