"""The O(N) consistency check of an ``.idx`` against its ``.bin``, and its memo.

:func:`check_index_arrays` checks, vectorized in bounded-memory chunks, what the
O(1) checks at open cannot see: every sequence length is non-negative, every
pointer is where the lengths before it say (so pointers are aligned to the token
size and never overlap), the document indices never decrease, and the lengths
cover the ``.bin`` file exactly. A few ms per million sequences.

A pair that passed is remembered by its identity (:func:`file_identity`: real
path, size, inode, device, mtime and ctime in nanoseconds of both files), in this
process and, when a cache folder is given, in a small JSON record there, so opening
the same unchanged files again (another run, another rank, another process) skips
the scan. Any change to either file (a rewrite, a rename over it, a ``touch``)
changes its identity, and the next open checks it again. Timestamps are coarse
(a kernel tick, up to 2 s on some file systems), so a file changed within that
window of its last change could keep its identity: like git's "racily clean"
rule, a pair whose newest timestamp is less than :data:`SETTLE_NS` older than the
moment of the ``stat`` is checked every time and never remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

from epochal._atomic import atomic_write
from epochal.data.indexed.indexed_format import IndexedFileError

__all__ = ["check_index_arrays", "file_identity", "is_remembered", "remember"]

CHUNK = 1 << 16  # index entries checked per step: scratch arrays stay in the CPU cache

#: a file changed less than this long before it is stat'ed is not remembered (racy timestamps)
SETTLE_NS = 2_000_000_000

#: identities of the pairs that passed :func:`check_index_arrays` in this process
_VALIDATED: set[tuple] = set()


def check_index_arrays(
    lengths: np.ndarray,
    pointers: np.ndarray,
    documents: np.ndarray,
    itemsize: int,
    bin_size: int,
    idx_path: str,
    bin_path: str,
) -> None:
    """Check every entry of an index against the lengths and the ``.bin`` size.

    Args:
        lengths: int32 ``(N,)`` tokens per sequence.
        pointers: int64 ``(N,)`` byte offset of each sequence in the ``.bin``.
        documents: int64 ``(D,)`` document indices (first 0 and last N already checked).
        itemsize: bytes per token.
        bin_size: size of the ``.bin`` file in bytes.
        idx_path, bin_path: the files, for the messages.

    Raises:
        IndexedFileError: naming ``idx_path`` (or ``bin_path`` for trailing bytes) and
            the first bad entry.
    """
    n = len(lengths)
    width = min(CHUNK, max(n, len(documents) - 1, 1))
    sizes = np.empty(width, dtype=np.int64)  # scratch, reused: no allocation per chunk
    steps = np.empty(width, dtype=np.int64)
    flags = np.empty(width, dtype=bool)
    end = 0  # byte where the next sequence must start
    for start in range(0, n, CHUNK):
        chunk = lengths[start : start + CHUNK]
        k = len(chunk)
        if chunk.min() < 0:
            i = start + int(np.argmax(chunk < 0))
            raise IndexedFileError(
                f"{idx_path}: sequence {i} has negative length {int(lengths[i])}"
            )
        size = np.multiply(chunk, itemsize, out=sizes[:k], dtype=np.int64)
        ptrs = pointers[start : start + CHUNK]
        # pointer j must equal pointer j-1 + size j-1: compare differences, no cumulative sum
        step = np.subtract(ptrs[1:], ptrs[:-1], out=steps[: k - 1])
        wrong = np.not_equal(step, size[:-1], out=flags[: k - 1])
        first_bad = -1 if ptrs[0] == end else 0
        if first_bad < 0 and wrong.any():
            first_bad = 1 + int(np.argmax(wrong))
        if first_bad >= 0:
            i = start + first_bad
            expected = (
                end if first_bad == 0 else int(ptrs[first_bad - 1]) + int(size[first_bad - 1])
            )
            raise IndexedFileError(
                f"{idx_path}: sequence {i} starts at byte {int(pointers[i])}, expected "
                f"{expected} from the lengths before it (corrupt index)"
            )
        end = int(ptrs[-1]) + int(size[-1])
        if end > bin_size:  # also stops int64 wrap-around (a chunk adds < 2**51 bytes)
            raise IndexedFileError(
                f"{idx_path}: index points past the end of {bin_path} (needs at least {end} bytes, "
                f"file has {bin_size})"
            )
    for start in range(0, max(len(documents) - 1, 0), CHUNK):
        chunk = documents[start : start + CHUNK + 1]
        decreasing = np.less(chunk[1:], chunk[:-1], out=flags[: len(chunk) - 1])
        if decreasing.any():
            k = start + int(np.argmax(decreasing))
            raise IndexedFileError(
                f"{idx_path}: document_indices decrease at entry {k + 1} "
                f"({int(documents[k])} -> {int(documents[k + 1])}; corrupt index)"
            )
    if end < bin_size:
        raise IndexedFileError(
            f"{bin_path}: {bin_size - end} trailing bytes not covered by {idx_path} (files do not match)"
        )


def file_identity(*paths: str, **options: object) -> tuple[tuple, bool]:
    """Return what identifies the current contents of ``paths`` (plus ``options``).

    Per file: real path, size, inode, device, mtime and ctime (ns). ``ctime`` cannot be
    set back by a user, so an in-place edit that restores the mtime still changes it.

    Returns:
        ``(identity, settled)``: ``settled`` is false when a file changed less than
        :data:`SETTLE_NS` before now (its identity may not change on a further edit,
        so it must not be remembered).

    Raises:
        OSError: a file cannot be stat'ed.
    """
    now = time.time_ns()
    parts: list[object] = []
    newest = 0
    for path in paths:
        real = os.path.realpath(path)
        st = os.stat(real)
        parts.append((real, st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns))
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    parts.append(tuple(sorted(options.items())))
    return tuple(parts), newest < now - SETTLE_NS


def _record_path(cache_dir: str, identity: tuple) -> str:
    digest = hashlib.blake2b(repr(identity[0][0]).encode(), digest_size=16).hexdigest()
    return os.path.join(cache_dir, f"{digest}-validated.json")


def _as_json(identity: tuple) -> list:
    return json.loads(json.dumps(identity))


def is_remembered(identity: tuple, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether a pair with exactly this identity passed the check before.

    Looks in this process's memo, then in ``cache_dir``'s record (if given); an
    unreadable or stale record just means "not remembered".
    """
    if identity in _VALIDATED:
        return True
    if cache_dir is None:
        return False
    try:
        with open(_record_path(os.fspath(cache_dir), identity), encoding="utf-8") as handle:
            stored = json.load(handle)
    except (OSError, ValueError):
        return False
    if stored.get("identity") != _as_json(identity):
        return False
    _VALIDATED.add(identity)
    return True


def remember(identity: tuple, cache_dir: str | os.PathLike | None = None) -> None:
    """Record that the pair with this identity passed (in memory, and in ``cache_dir``).

    Call only for a *settled* identity (see :func:`file_identity`).

    The record is written atomically; a cache folder that cannot be written is
    ignored (the check then simply runs again next time).
    """
    _VALIDATED.add(identity)
    if cache_dir is None:
        return
    cache_dir = os.fspath(cache_dir)
    try:
        os.makedirs(cache_dir, exist_ok=True)
        atomic_write(
            _record_path(cache_dir, identity), json.dumps({"identity": _as_json(identity)}) + "\n"
        )
    except OSError:
        pass
