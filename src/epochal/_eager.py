"""Functions that ``torch.compile`` must not trace, without loading TorchDynamo at import time.

``torch.compiler.disable`` imports TorchDynamo (about two seconds of CPU), so applying it
as a decorator when a module is imported would make every ``epochal`` command and every
process of a parallel run pay for it, compiled or not. :func:`eager` defers it: while
TorchDynamo is not loaded nothing can be compiling and the function is called as it is;
once it is loaded (``torch.compile``, pipeline schedules), the disabled function is made
once and called instead. :func:`disable_compile_everywhere` makes them all up front;
:func:`epochal.parallel.part_wrappers.compile_part` calls it before compiling, so a
traced call finds the disabled function ready.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["disable_compile_everywhere", "eager"]

F = TypeVar("F", bound=Callable[..., Any])

_DYNAMO = "torch._dynamo"


class _Eager:
    """``fn`` and, once made, ``torch.compiler.disable(fn)``."""

    registry: list[_Eager] = []

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.disabled: Callable[..., Any] | None = None
        _Eager.registry.append(self)

    def prepare(self) -> Callable[..., Any]:
        if self.disabled is None:
            self.disabled = torch.compiler.disable(self.fn)
        return self.disabled


def eager(fn: F) -> F:
    """``fn`` never traced by ``torch.compile`` (``torch.compiler.disable``, applied lazily).

    For functions and methods. The returned function calls ``fn`` directly until
    TorchDynamo is loaded, then the disabled version.
    """
    entry = _Eager(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        disabled = entry.disabled
        if disabled is None:
            if _DYNAMO not in sys.modules:  # nothing can be compiling
                return fn(*args, **kwargs)
            disabled = entry.prepare()
        return disabled(*args, **kwargs)

    return call  # type: ignore[return-value]


def disable_compile_everywhere() -> None:
    """Make every :func:`eager` function's disabled version now (before ``torch.compile``)."""
    for entry in _Eager.registry:
        entry.prepare()
