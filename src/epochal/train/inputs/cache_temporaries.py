"""Temporary folders of the data cache: named per process, and removed when their process died.

A cache entry (a converted protein set, the synthetic proteins, a tokenized corpus) is
written under ``<cache>/.tmp-<entry>.<host>.<pid>.<random>`` and renamed when complete,
so a ``kill -9`` mid-conversion leaves only such a folder behind. The next process
that writes an entry of the same kind removes the temporaries of dead processes on
this host (and unnamed ones of older releases, ``.tmp-<entry>-<pid>``), as the
checkpointer does for its ``.tmp-step_*`` folders (the same
:func:`~epochal.train.state.run_lock.temporary_token` /
:func:`~epochal.train.state.run_lock.stale_temporary` test). Those of live processes
and of other hosts (a shared cache) are left alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from epochal.train.state.run_lock import stale_temporary, temporary_token

__all__ = ["cache_temporary", "remove_stale_temporaries"]


def remove_stale_temporaries(cache: Path, kind: str) -> list[Path]:
    """Remove ``<cache>/.tmp-<kind>*`` folders whose process is dead; returns those removed."""
    removed = []
    for path in sorted(cache.glob(f".tmp-{kind}*")):
        if stale_temporary(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def cache_temporary(folder: Path, kind: str) -> Path:
    """A new temporary name for the cache entry ``folder`` (after removing dead ones of ``kind``).

    Args:
        folder: the final folder, ``<cache>/<name>``.
        kind: the prefix shared by entries of this sort (``"proteins-"``, ``"corpus-"``).

    Returns:
        ``<cache>/.tmp-<name>.<host>.<pid>.<random>`` (not created).
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(folder.parent, kind)
    return folder.parent / f".tmp-{folder.name}.{temporary_token()}"
