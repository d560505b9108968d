"""Lazy attribute export for package ``__init__`` modules.

Public names are imported from their defining module on first access, so that
``import epochal.data`` stays cheap and one missing optional dependency (e.g.
Lightning) only fails the name that needs it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def module_path(package: str, module_name: str) -> str:
    """The full name of export-table entry ``module_name`` of ``package`` (see :func:`lazy_exports`)."""
    if module_name.startswith(package.partition(".")[0] + "."):
        return module_name
    return f"{package}.{module_name}"


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build ``__getattr__`` and ``__dir__`` for a package.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the module that defines it: a submodule relative to
            ``package`` (``"hf.io"``), or a full name under the same top-level package
            (``"epochal.formats.common"``) for a name defined in another package.

    Returns:
        ``(__getattr__, __dir__)`` to assign in the package namespace.
    """

    def __getattr__(name: str) -> Any:
        try:
            module_name = exports[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        module = importlib.import_module(module_path(package, module_name))
        return getattr(module, name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
