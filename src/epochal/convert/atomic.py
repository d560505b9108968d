"""Write a whole output folder or file so that it is never seen half-written."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_directory", "atomic_write_text"]


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; rename it to ``final`` when the block succeeds.

    On an exception the temporary folder is removed and ``final`` is untouched.

    Args:
        final: the folder to create.
        overwrite: replace an existing ``final`` (it is swapped out, then deleted).

    Raises:
        FileExistsError: ``final`` exists (and is not an empty folder) and ``overwrite`` is false.
    """
    final = Path(final)
    if final.exists() and not overwrite:
        if not (final.is_dir() and not any(final.iterdir())):
            raise FileExistsError(
                f"{final}: output exists (pass overwrite / --overwrite to replace it)"
            )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        trash = final.parent / f".trash-{final.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
