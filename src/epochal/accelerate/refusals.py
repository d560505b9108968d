"""What the user sees when the front end refuses something: the message at the script's line.

An ``epochal.accelerate`` error that reaches the top of a script (every ``*Error``
class of this package: an option, a model, a loader or a call the front end
refuses, each with what to change) is printed as one line naming the script's file
and line, the error and its message, with no traceback: the message is the whole
story, as with ``accelerate launch``'s argument errors. The process still exits
with status 1. ``EPOCHAL_TRACEBACK=1`` prints the full traceback instead; any other
exception is left to the previous ``sys.excepthook``.

:func:`install` is called by ``Accelerator()``; calling it again does nothing.
"""

from __future__ import annotations

import os
import site
import sys
import sysconfig
import traceback
from types import TracebackType

__all__ = ["install", "is_refusal", "where"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_refusal(error: BaseException) -> bool:
    """Whether ``error`` is one of this package's refusals (an ``*Error`` it defines)."""
    kind = type(error)
    return kind.__module__.startswith("epochal.accelerate") and kind.__name__.endswith("Error")


def _library_roots() -> tuple[str, ...]:
    """Folders of installed code: the standard library and the site-packages folders."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages())
    return tuple(os.path.abspath(r) + os.sep for r in roots if r)


def _is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    return filename.startswith("<frozen") or path.startswith(_library_roots())


def where(tb: TracebackType | None) -> str:
    """``file:line`` of the user's call: the innermost frame in neither epochal nor a library.

    A refusal raised inside ``model(**batch)`` passes through ``torch.nn.Module.__call__``
    (and a loader's through PyTorch's ``DataLoader``): those frames are skipped, so the
    line named is the script's. Without any such frame, the innermost frame outside
    epochal; ``""`` when there is none.
    """
    frames = [
        f
        for f in traceback.extract_tb(tb)
        if not os.path.abspath(f.filename).startswith(_PACKAGE + os.sep)
    ]
    mine = [f for f in frames if not _is_library(f.filename)] or frames
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else ""


def _hook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    if os.environ.get("EPOCHAL_TRACEBACK", "") not in ("", "0") or not is_refusal(error):
        _previous(kind, error, tb)
        return
    place = where(tb)
    prefix = f"{place}: " if place else ""
    rank = os.environ.get("RANK")
    who = f"[rank{rank}] " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""
    print(f"{who}{prefix}{kind.__name__}: {error}", file=sys.stderr, flush=True)


_previous = sys.excepthook


def install() -> None:
    """Print this package's refusals as one line (see the module docstring)."""
    global _previous
    if sys.excepthook is not _hook:
        _previous = sys.excepthook
        sys.excepthook = _hook
