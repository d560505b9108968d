"""The question-and-answer machinery of ``epochal config`` (its TOML and its ``--accelerate`` YAML wizard).

A :class:`Question` has a default that may depend on the earlier answers, a parser
that raises :class:`_Invalid` with the reason (the wizard then asks again), and a
condition under which it is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Question"]


class _Invalid(ValueError):
    """An answer that cannot be used; the message is shown before asking again."""


@dataclass
class Question:
    """One question of the wizard.

    Attributes:
        key: the answer's name in the answers dict.
        prompt: the text shown (the default follows in brackets).
        default: a function of the answers so far giving the default answer (text).
        parse: turns the answer text into a value; raises ``_Invalid`` with the reason.
        ask_if: asked only when this returns True for the answers so far (else the
            question is skipped and the preset's value stays).
    """

    key: str
    prompt: str
    default: Callable[[dict[str, Any]], str]
    parse: Callable[[str], Any]
    ask_if: Callable[[dict[str, Any]], bool] = lambda answers: True


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _Invalid(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise _Invalid(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _Invalid(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise _Invalid(f"must be >= 0, got {text}")
    return value


def _yes_no(text: str) -> bool:
    t = text.strip().lower()
    if t in ("y", "yes", "true", "1"):
        return True
    if t in ("n", "no", "false", "0"):
        return False
    raise _Invalid(f"answer yes or no, got {text!r}")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip().lower()
        if t not in choices:
            raise _Invalid(f"choose one of {', '.join(choices)}; got {text!r}")
        return t

    return parse
