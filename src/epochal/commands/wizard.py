"""The question-and-answer machinery of ``epochal config`` (its TOML and its ``--accelerate`` YAML wizard).

A :class:`Question` has a default that may depend on the earlier answers, a parser
that raises :class:`_Invalid` with the reason (the wizard then asks again), and a
condition under which it is asked. :func:`layout_questions` are the questions both
wizards ask about the parallel layout, precision and clipping, under one set of keys;
each wizard writes the answers in its own format (``[parallel]`` options of the same
names in the TOML; Accelerate's ``megatron_lm_*`` keys in the YAML). :func:`ask` asks
one question until its answer parses and the wizard's check accepts the answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Question", "ask", "layout_questions"]


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


def layout_questions() -> dict[str, Question]:
    """The questions both wizards ask, by key, each with its prompt, default, parser and condition.

    ``nodes``, ``tensor_parallel``, ``sequence_parallel`` (asked when ``tensor_parallel > 1``),
    ``pipeline_parallel``, ``data_parallel``, ``selective_recompute``,
    ``distributed_optimizer`` (asked when ``data_parallel > 1``), ``clip_grad`` and
    ``precision`` (``no``, ``fp16`` or ``bf16``). A wizard lists them in its order among its
    own questions, and may give one a default of its own (``dataclasses.replace``).
    """
    questions = [
        Question("nodes", "How many machines (nodes)", lambda a: "1", _positive_int),
        Question(
            "tensor_parallel",
            "Tensor parallel size (must divide the attention heads)",
            lambda a: "1",
            _positive_int,
        ),
        Question(
            "sequence_parallel",
            "Sequence parallelism (shard norms/dropout over the tensor-parallel ranks)? [yes/no]",
            lambda a: "no",
            _yes_no,
            ask_if=lambda a: a["tensor_parallel"] > 1,
        ),
        Question("pipeline_parallel", "Pipeline parallel size", lambda a: "1", _positive_int),
        Question(
            "data_parallel", "Data parallel size (model replicas)", lambda a: "1", _positive_int
        ),
        Question(
            "selective_recompute",
            "Selective activation recompute? [yes/no]",
            lambda a: "no",
            _yes_no,
        ),
        Question(
            "distributed_optimizer",
            "Distributed optimizer (shard optimizer state over data-parallel ranks)? [yes/no]",
            lambda a: "no",
            _yes_no,
            ask_if=lambda a: a["data_parallel"] > 1,
        ),
        Question(
            "clip_grad",
            "Gradient clipping max norm (0 = off)",
            lambda a: "1.0",
            _non_negative_float,
        ),
        Question(
            "precision",
            "Mixed precision (no, fp16, bf16)",
            lambda a: "no",
            _choice("no", "fp16", "bf16"),
        ),
    ]
    return {q.key: q for q in questions}


def ask(
    q: Question,
    answers: dict[str, Any],
    read: Callable[[str], str],
    check: Callable[[dict[str, Any]], object],
) -> Any:
    """Ask ``q`` until its answer parses and ``check(answers)`` accepts it; returns the answer.

    ``read`` shows the prompt and returns the text typed (Enter keeps the default in
    brackets). An answer the parser or ``check`` refuses (:class:`_Invalid`) is printed
    with the reason and the question asked again.
    """
    default = q.default(answers)
    while True:
        text = read(f"{q.prompt} [{default}]: ").strip() or default
        try:
            answers[q.key] = q.parse(text)
            check(answers)
            return answers[q.key]
        except _Invalid as exc:
            answers.pop(q.key, None)
            print(f"  invalid: {exc}; please answer again", flush=True)
