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

__all__ = [
    "aside_directory",
    "atomic_directory",
    "atomic_path",
    "atomic_write",
    "fsync_dir",
    "replace_directory",
]


def _temporary_sibling(path: Path, prefix: str, suffix: str = "") -> Path:
    """``.<prefix><name>.<pid>-<random><suffix>`` in ``path``'s folder (unique per call)."""
    return path.with_name(f".{prefix}{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{suffix}")


def _umask() -> int:
    """The process's umask (reading it means setting it: set and restore at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        # the mode a plain open() gives (safetensors' writer, for one, creates 0600 files)
        os.chmod(tmp, 0o666 & ~_umask())
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


def aside_directory(final: str | os.PathLike) -> Path:
    """Where :func:`replace_directory` parks the old ``final`` while it swaps in the new one.

    A crash between its two renames leaves ``final`` missing and its previous,
    complete content here (``.old-<name>`` beside it); readers that find ``final``
    gone may fall back to this folder.
    """
    final = Path(final)
    return final.with_name(f".old-{final.name}")


def replace_directory(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Move the complete folder ``tmp`` to ``final``, swapping out an existing ``final``.

    ``os.replace`` cannot replace a non-empty folder, so an existing ``final`` is first
    renamed to :func:`aside_directory` (``final`` is missing only between two renames,
    and then its old content is complete under that name) and deleted after.
    """
    tmp, final = Path(tmp), Path(final)
    aside = aside_directory(final)
    if final.exists():
        if aside.exists():  # left by an earlier crash after the second rename
            shutil.rmtree(aside)
        os.replace(final, aside)
        os.replace(tmp, final)
    else:
        os.replace(tmp, final)
    shutil.rmtree(aside, ignore_errors=True)
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
