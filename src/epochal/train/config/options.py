"""Every configuration option with its type, default and description, read from the classes.

:func:`describe_options` walks :class:`~epochal.train.config.TrainConfig` and returns one
:class:`OptionInfo` per option: the dotted name, the type from the annotation, the
default (or a configuration's value) and the description from the ``Attributes:``
section of the section class's docstring (``[model]``: :class:`epochal.model.ModelConfig`'s),
so ``epochal train --list-options`` and the documentation's option reference cannot
drift from the code. An entry ``a / b: text`` describes ``a`` and ``b`` alike.
:func:`close_options` suggests the options nearest to a mistyped one.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "OptionInfo",
    "attribute_docs",
    "close_options",
    "describe_options",
    "first_sentence",
    "format_type",
    "plain",
]

_HEADER = re.compile(r"^([a-z_][a-z0-9_]*(?:\s*[/,]\s*[a-z_][a-z0-9_]*)*)\s*:(?:\s+(.*))?$")


@dataclass(frozen=True)
class OptionInfo:
    """One configuration option.

    Attributes:
        name: the dotted option (``training.train_iters``; ``run_dir`` at the top).
        section: the section (``training``), ``""`` for top-level options.
        type: the annotation as text (``int``, ``float | None``, ``auto|cpu|cuda``).
        default: the value (the built-in default, or the configuration's that was described).
        description: the docstring's text for it, one paragraph.
        megatron: the Megatron-LM flag it mirrors, or None.
        bionemo: the BioNeMo ``train_esm2`` / ``finetune_esm2`` flag it mirrors, or None.
    """

    name: str
    section: str
    type: str
    default: Any
    description: str
    megatron: str | None = None
    bionemo: str | None = None

    @property
    def summary(self) -> str:
        """The description's first sentence (up to a ``.`` or ``;`` outside parentheses)."""
        return first_sentence(self.description)


def first_sentence(text: str) -> str:
    """``text`` up to the first ``.``/``;`` that ends a clause outside parentheses and quotes."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == "`":
            quoted = not quoted
        elif quoted:
            continue
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch in ".;" and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if not text[:i].endswith(("e.g", "i.e", "etc")):
                return text[:i]
    return text


def plain(text: str) -> str:
    """``text`` without docstring markup, for a terminal: double backquotes and roles (``:mod:``)."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "")


def attribute_docs(cls: type) -> dict[str, str]:
    """``{attribute: description}`` from the ``Attributes:`` section of ``cls``'s docstring.

    An entry is a line ``name: text`` (or ``a / b: text`` for several names) at the
    section's indentation, continued by more indented lines; other lines at that
    indentation end the entry, a less indented line ends the section.
    """
    doc = inspect.cleandoc(cls.__doc__ or "")
    out: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return out
    indent = None
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for name in names:
            out[name] = " ".join(text).strip()

    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break
        if depth > indent:
            if names:
                text.append(line.strip())
            continue
        flush()
        m = _HEADER.match(line.strip())
        names = re.split(r"\s*[/,]\s*", m.group(1)) if m else []
        text = [m.group(2) or ""] if m else []
    flush()
    return out


def format_type(tp: Any) -> str:
    """An annotation as short text: ``int``, ``list[str]``, ``float | None``, ``auto|cpu|cuda``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(format_type(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{format_type(typing.get_args(tp)[0])}]"
    if origin is dict:
        return "table"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _doc_class(section: Any) -> type:
    from epochal.model.config import ModelConfig
    from epochal.train.config.model import ModelSection

    return ModelConfig if isinstance(section, ModelSection) else type(section)


def describe_options(section: str | None = None, config: Any = None) -> list[OptionInfo]:
    """Every option of the configuration tree, in declaration order.

    Args:
        section: only this section (``"training"``); ``""`` for the top-level options;
            None for all.
        config: a ``TrainConfig`` whose values to report; default: the built-in
            defaults (``TrainConfig()``, no preset).

    Raises:
        ConfigError: an unknown section (with the closest known ones).
    """
    from epochal.model.config import ConfigError
    from epochal.train.config.flags import BIONEMO_FLAGS, MEGATRON_FLAGS
    from epochal.train.config.tree import TrainConfig

    config = TrainConfig() if config is None else config
    top_hints = typing.get_type_hints(TrainConfig)
    sections = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if dataclasses.is_dataclass(getattr(config, f.name))
    }
    if section is not None and section and section not in sections:
        near = difflib.get_close_matches(section, list(sections), n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(near)}?" if near else ""
        raise ConfigError(
            "--list-options", f"no section {section!r}{hint} (sections: {', '.join(sections)})"
        )

    def info(name: str, sec: str, tp: Any, value: Any, doc: str) -> OptionInfo:
        return OptionInfo(
            name,
            sec,
            format_type(tp),
            value,
            doc,
            MEGATRON_FLAGS.get(name),
            BIONEMO_FLAGS.get(name),
        )

    out: list[OptionInfo] = []
    if section in (None, ""):
        top_docs = attribute_docs(TrainConfig)
        for f in dataclasses.fields(config):
            if f.name not in sections:
                value = getattr(config, f.name)
                out.append(info(f.name, "", top_hints[f.name], value, top_docs.get(f.name, "")))
    for name, obj in sections.items():
        if section is not None and name != section:
            continue
        docs = attribute_docs(_doc_class(obj))
        hints = typing.get_type_hints(type(obj))
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            out.append(info(f"{name}.{f.name}", name, hints[f.name], value, docs.get(f.name, "")))
    return out


def close_options(key: str, known: list[str], *, everywhere: list[str] = ()) -> list[str]:
    """Up to three of ``known`` nearest to the mistyped ``key`` (``difflib``'s ratio), best first.

    Only names scoring within 0.1 of the best one are kept, so a clear match comes alone.

    Args:
        key: the unknown name (a section's key, or a top-level one).
        known: the names valid where ``key`` was given.
        everywhere: dotted names of every option: a top-level ``key`` close to the last
            part of one of them (``--train_iters``) suggests the dotted name.
    """

    def ratio(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    scores = {name: ratio(key, name) for name in known}
    for dotted in everywhere:
        scores[dotted] = max(scores.get(dotted, 0.0), ratio(key, dotted.rpartition(".")[2]))
    ranked = sorted((s, n) for n, s in scores.items() if s >= 0.6)
    ranked.sort(key=lambda item: -item[0])
    if not ranked:
        return []
    best = ranked[0][0]
    return [n for s, n in ranked if s >= best - 0.1][:3]
