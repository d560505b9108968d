"""Merging nested option dicts (TOML tables): a preset, a config file and overrides, later winning.

:func:`deep_merge` merges tables key by key, recursively; any other value replaces the
earlier one. Two markers, used by the presets to say how one derives from another:
a table wrapped in :class:`Replace` replaces the earlier table whole instead of merging into
it, and :data:`DROP` removes the key.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["DROP", "Replace", "deep_merge"]


class Replace(dict):
    """A table that replaces the earlier table of its key whole (no key of the earlier one stays)."""


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


#: A value that removes its key from the earlier table.
DROP: Any = _Drop()


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged over it; neither is changed, the result shares no table.

    Keys keep ``base``'s order; keys new in ``update`` follow in its order.
    """
    out = copy.deepcopy(base)
    for key, value in update.items():
        if value is DROP:
            out.pop(key, None)
        elif isinstance(value, Replace):
            out[key] = copy.deepcopy(dict(value))
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
