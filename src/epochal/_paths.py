"""Paths a checkpoint refers to, and where a command may write (used by commands/, convert/, formats/, train/).

- :func:`confined_path`: a file name read from a checkpoint (a Hugging Face index's
  ``weight_map`` entry, DCP storage metadata's ``relative_path``) resolved inside the
  checkpoint folder, refused (:class:`UnsafePathError`) when it is absolute, holds
  ``..`` or leaves the folder through a link, before anything is opened.
- :func:`check_output_apart`: a command's output may not be its input, contain it
  or sit inside it (``epochal convert RUN RUN --overwrite`` would delete the run,
  ``epochal embed --output`` equal to ``--input`` would overwrite the table).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["UnsafePathError", "check_output_apart", "confined_path"]


class UnsafePathError(ValueError):
    """A path a checkpoint names leaves its folder, or an output overlaps its input."""


def confined_path(folder: str | os.PathLike, name: object, source: str) -> Path:
    """``folder / name`` for a relative ``name`` that stays inside ``folder``.

    Args:
        folder: the checkpoint folder.
        name: the reference as read from the checkpoint (must be a non-empty string).
        source: the file that holds the reference, for the error.

    Returns:
        The path inside ``folder`` (it need not exist).

    Raises:
        UnsafePathError: ``name`` is not a string, is empty, absolute (POSIX or Windows
            form), contains a ``..`` component, or resolves (through links) outside
            ``folder``.
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafePathError(f"{source}: file reference {name!r} is not a file name")
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or name.startswith("~"):
        raise UnsafePathError(
            f"{source}: file reference {name!r} is an absolute path; checkpoint files must "
            "lie inside the checkpoint folder"
        )
    if ".." in posix.parts or ".." in windows.parts:
        raise UnsafePathError(
            f"{source}: file reference {name!r} leaves the checkpoint folder ('..')"
        )
    folder = Path(folder)
    path = folder / name
    root = folder.resolve()
    if not path.resolve().is_relative_to(root):
        raise UnsafePathError(
            f"{source}: file reference {name!r} resolves outside the checkpoint folder {folder}"
        )
    return path


def check_output_apart(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    source_name: str = "the input",
    output_name: str = "output",
) -> None:
    """Refuse an ``output`` that is ``source``, contains it, or lies inside it.

    Every command that writes applies it to each of its inputs (``epochal convert``'s
    input; ``embed``'s ``--input`` and ``--checkpoint``; ``fill-mask`` and ``generate``'s
    checkpoint and files; ``merge`` and ``preprocess``'s inputs; ``plot``'s metrics).
    Both are compared resolved (links followed), whether or not ``output`` exists.

    Args:
        source / output: the paths.
        source_name / output_name: how the message calls them (e.g. ``"--input"``).

    Raises:
        UnsafePathError: naming both paths.
    """
    src = Path(source).resolve()
    out = Path(output).resolve()
    if out == src:
        raise UnsafePathError(
            f"{output_name} {output} is {source_name} {source}; write somewhere else"
        )
    if src.is_relative_to(out):
        raise UnsafePathError(
            f"{output_name} {output} contains {source_name} {source} (replacing it would "
            "delete it); write somewhere else"
        )
    if out.is_relative_to(src):
        raise UnsafePathError(
            f"{output_name} {output} lies inside {source_name} {source}; write somewhere outside it"
        )
