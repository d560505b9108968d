"""Small wording helpers for messages: counts with the right noun form."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: float, noun: str, plural_noun: str | None = None, *, fmt: str = "") -> str:
    """``"1 process"``, ``"2 processes"``: ``count`` and ``noun``, plural unless ``count == 1``.

    Args:
        count: the number.
        noun: the singular form.
        plural_noun: the plural form; default: ``noun + "s"`` (``"es"`` after s, x, sh, ch).
        fmt: a format spec for ``count`` (``","`` -> ``"1,024 tokens"``).
    """
    if count == 1:
        return f"{count:{fmt}} {noun}"
    if plural_noun is None:
        plural_noun = noun + ("es" if noun.endswith(("s", "x", "sh", "ch")) else "s")
    return f"{count:{fmt}} {plural_noun}"
