"""Write files and folders so that nobody ever sees them half-written.

Every layer uses these (the data layer's builders and caches, the trainer's
checkpoints and plots, the converters' outputs), so they live at the package root
next to :mod:`epochal._lazy` and import nothing from epochal.

The pattern is always the same: write under a unique temporary name in the same
folder (same filesystem), flush and ``fsync``, then ``os.replace`` onto the final
name, which is atomic on POSIX. On an exception the temporary is removed and the
final name keeps whatever it held before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_directory", "atomic_path", "atomic_write", "fsync_dir", "replace_directory"]


def _temporary_sibling(path: Path, prefix: str, suffix: str = "") -> Path:
    """``.<prefix><name>.<pid>-<random><suffix>`` in ``path``'s folder (unique per call)."""
    return path.with_name(f".{prefix}{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path next to ``path``; rename it to ``path`` when the block succeeds.

    For writers that want a file name (``np.save``, ``savefig``, safetensors). The
    temporary keeps ``path``'s suffix, so writers that infer a format from it work.

    Raises:
        Whatever the block raises (the temporary is removed; ``path`` is untouched).
    """
    path = Path(path)
    tmp = _temporary_sibling(path, "tmp-", path.suffix)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` through a temporary file and rename.

    Raises:
        OSError: the folder does not exist or is not writable (``path`` is untouched).
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(payload)


def fsync_dir(path: str | os.PathLike) -> None:
    """``fsync`` a folder so that renames inside it survive a power cut (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_directory(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the complete folder ``tmp`` to ``final``, swapping out an existing ``final``.

    ``os.replace`` cannot replace a non-empty folder, so an existing ``final`` is first
    renamed aside (``final`` is missing only between two renames) and deleted after.
    """
    tmp, final = Path(tmp), Path(final)
    if final.exists():
        trash = _temporary_sibling(final, "trash-")
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling folder; it becomes ``final`` when the block succeeds.

    On an exception the temporary folder is removed and ``final`` is untouched.

    Args:
        final: the folder to create.
        overwrite: replace an existing ``final``.

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
    tmp = _temporary_sibling(final, "tmp-")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    replace_directory(tmp, final)
