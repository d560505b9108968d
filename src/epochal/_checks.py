"""Configuration checks driven by the dataclass fields' annotations: one checker for every section.

A field declared with :func:`checked` is checked by :func:`check_fields` from its
annotation and the :class:`Check` in its metadata:

- ``bool``: ``True`` or ``False``;
- ``int``: an integer that is not a ``bool`` (``True`` is not the integer 1 here);
- ``float``: a finite number, ``int`` accepted, ``bool``, NaN and infinities refused;
- ``str``: a string; ``Literal[...]``: one of the listed values;
- ``X | None``: ``None`` or an ``X`` (the message says what ``None`` means, ``Check.none``);

and a number within the bounds ``ge`` / ``gt`` / ``le`` / ``lt`` (``even``: a multiple of 2).
Every refusal is a :class:`ConfigError` naming the field, the allowed values and the value
given, e.g. ``hidden_size: must be an integer >= 1, got 0``. Rules between fields stay written
out in the sections' ``__post_init__`` with :func:`require`.

This module sits at the package root so that every layer (``data`` included) can use it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Check", "ConfigError", "check_fields", "checked", "is_int", "is_real", "require"]


class ConfigError(ValueError):
    """An invalid configuration value.

    Attributes:
        option: the dotted name of the offending option (e.g. ``"hidden_size"``
            or, once a config tree re-raises it, ``"model.hidden_size"``).
        detail: the message without the option name.
    """

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        self.detail = message
        super().__init__(f"{option}: {message}")

    def with_prefix(self, prefix: str) -> ConfigError:
        """Return the same error with ``prefix.`` prepended to the option name."""
        return ConfigError(f"{prefix}.{self.option}", self.detail)


def require(cond: bool, option: str, message: str) -> None:
    """Raise ``ConfigError(option, message)`` unless ``cond``."""
    if not cond:
        raise ConfigError(option, message)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """Whether ``value`` is a finite ``int`` or ``float`` and not a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Check:
    """What a field's value may be besides its annotated type.

    Attributes:
        ge / gt / le / lt: bounds of a number (``>=``, ``>``, ``<=``, ``<``); None = open.
        even: an integer that is a multiple of 2.
        none: what ``None`` stands for, shown in the message (``X | None`` fields).
        note: shown in parentheses after the range, e.g. the unit (``"tokens"``).
        what: the noun of the message instead of the type's (``"an integer"``; floats
            have none unless they have no bounds: ``"a number"``).
        text: a number's whole allowed-values phrase (``None`` included) instead of the one
            built from the above, e.g. ``"> 0 (or unset: the detected GPU's)"``.
        group: the name a section passes to :func:`check_fields` to check this field
            (fields that apply only to some configurations, e.g. ``"t5"``).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    even: bool = False
    none: str = ""
    note: str = ""
    what: str | None = None
    text: str = ""
    group: str = ""


def checked(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    **check: Any,
) -> Any:
    """A dataclass field checked by :func:`check_fields` (``check``: :class:`Check`'s fields).

    ``checked(1, ge=1)`` is ``field(default=1, metadata={"check": Check(ge=1)})``.
    """
    return dataclasses.field(
        default=default, default_factory=default_factory, metadata={"check": Check(**check)}
    )


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(config: Any, group: str = "") -> None:
    """Check the :func:`checked` fields of dataclass ``config`` in ``group``, in declaration order.

    Raises:
        ConfigError: the first field whose value its annotation and :class:`Check` refuse.
    """
    hints = _annotations(type(config))
    for f in dataclasses.fields(config):
        spec = f.metadata.get("check")
        if spec is None or spec.group != group:
            continue
        value = getattr(config, f.name)
        allowed = _allowed(value, hints[f.name], spec)
        if allowed:
            raise ConfigError(f.name, f"must be {allowed}, got {value!r}")


def _allowed(value: Any, annotation: Any, spec: Check) -> str:
    """What ``value`` should be, or ``""`` when it is allowed."""
    tp, optional = _strip_none(annotation)
    if optional and value is None:
        return ""
    if tp is bool:
        ok, phrase = isinstance(value, bool), "true, false" if optional else "true or false"
    elif typing.get_origin(tp) is Literal:
        ok, phrase = value in typing.get_args(tp), f"one of {typing.get_args(tp)!r}"
    elif tp is str:
        ok, phrase = isinstance(value, str), "a string"
    elif tp is int or tp is float:
        ok = (is_int(value) if tp is int else is_real(value)) and _within(value, spec)
        if spec.text:
            return "" if ok else spec.text
        phrase = _range_phrase(tp, spec)
        if optional:  # the meaning of None first: "None (a dense model) or an integer >= 1"
            phrase = f"None ({spec.none}) or {phrase}" if spec.none else f"None or {phrase}"
            optional = False
    else:
        raise TypeError(f"checked() cannot check a field annotated {annotation!r}")
    if ok:
        return ""
    return f"{phrase} or None" if optional else phrase


def _strip_none(annotation: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, else ``(annotation, False)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(annotation)):
            return args[0], True
    return annotation, False


def _within(value: float, spec: Check) -> bool:
    return (
        (spec.ge is None or value >= spec.ge)
        and (spec.gt is None or value > spec.gt)
        and (spec.le is None or value <= spec.le)
        and (spec.lt is None or value < spec.lt)
        and (not spec.even or value % 2 == 0)
    )


def _range_phrase(tp: type, spec: Check) -> str:
    """``"an integer >= 1"``, ``"in [0, 1)"``, ``"an even integer >= 4"``, ``"> 0 (tokens)"``."""
    low = (f"{spec.ge!r}", "[") if spec.ge is not None else (f"{spec.gt!r}", "(")
    high = (f"{spec.le!r}", "]") if spec.le is not None else (f"{spec.lt!r}", ")")
    has_low = spec.ge is not None or spec.gt is not None
    has_high = spec.le is not None or spec.lt is not None
    if has_low and has_high:
        bounds = f"in {low[1]}{low[0]}, {high[0]}{high[1]}"
    elif has_low:
        bounds = f"{'>=' if spec.ge is not None else '>'} {low[0]}"
    elif has_high:
        bounds = f"{'<=' if spec.le is not None else '<'} {high[0]}"
    else:
        bounds = ""
    if spec.what is not None:
        noun = spec.what
    elif tp is int:
        noun = "an even integer" if spec.even else "an integer"
    else:
        noun = "" if bounds else "a number"
    phrase = " ".join(part for part in (noun, bounds) if part)
    return f"{phrase} ({spec.note})" if spec.note else phrase
