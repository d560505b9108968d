"""The numeric ``EPOCHAL_*`` environment variables, read by one checked parser.

Every layer reads a few limits from the environment (``EPOCHAL_MAX_PROTEIN_LENGTH``,
``EPOCHAL_MAX_CONFIG_BYTES``, ``EPOCHAL_MAX_POSITIONS``, ...), so the parser lives at
the package root next to :mod:`epochal._atomic` and imports nothing from epochal.

:func:`env_int` accepts a plain decimal integer (ASCII digits, ``_`` between digits as
in Python, an optional sign, surrounding spaces ignored) inside the variable's range; unset or empty is
the default. Anything else (a fraction, ``1e6``, ``nan``, ``inf``, a number
beyond the range, a value that does not fit a machine integer) is an error naming the
variable, the value given, the range allowed and the default, so a typo never silently
falls back to the default nor crashes deep inside a reader with ``OverflowError``.
"""

from __future__ import annotations

import os
import re

__all__ = ["EnvironmentVariableError", "env_int"]

_INTEGER = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")


class EnvironmentVariableError(ValueError):
    """An ``EPOCHAL_*`` environment variable holds a value epochal does not accept (named)."""


def env_int(
    name: str,
    default: int,
    *,
    minimum: int,
    maximum: int,
    unit: str,
    error: type[ValueError] = EnvironmentVariableError,
) -> int:
    """The integer value of environment variable ``name``, or ``default`` when unset or empty.

    Args:
        name: the variable (e.g. ``"EPOCHAL_MAX_PROTEIN_LENGTH"``).
        default: the value when the variable is unset or blank.
        minimum / maximum: the range accepted (both included).
        unit: what the number counts (``"characters"``, ``"bytes"``), for the message.
        error: the exception raised (a ``ValueError`` subclass of the caller's layer).

    Raises:
        error: the value is not a plain decimal integer, or is outside the range; the
            message names the variable, the value, the range and the default.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    shown = repr(raw) if len(raw) <= 60 else repr(raw[:40]) + f"... ({len(raw):,} characters)"
    allowed = f"an integer from {minimum:,} to {maximum:,} ({unit})"
    fix = f"set it to {allowed}, or unset it for the default {default:,}"
    if not _INTEGER.fullmatch(text):
        raise error(f"environment variable {name}={shown} is not a whole number of {unit}; {fix}")
    if len(text) > 40 or not minimum <= int(text) <= maximum:  # (40 digits: beyond any range)
        raise error(f"environment variable {name}={shown} is out of range; {fix}")
    return int(text)
