"""MkDocs hook: the reference pages generated from the code, so they cannot drift from it.

- ``reference/options.md``: every ``epochal train`` option (``--section.key=value``)
  with its type, default, meaning and the Megatron-LM / BioNeMo flag it mirrors;
- ``reference/presets.md``: every preset, its description and the settings it applies;
- ``reference/cli.md``: every subcommand's ``--help``, as ``epochal`` prints it;
- ``reference/api/<package>.md``: the public names of each package (its lazy
  ``_EXPORTS`` table), rendered by mkdocstrings from their docstrings.

The option rows come from :func:`option_rows`: the configuration dataclasses' fields,
types and defaults, and the meaning from the ``Attributes:`` section of each
section's docstring. It is the one function to change if the configuration gains
another source of descriptions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import re
import typing
from typing import Any, NamedTuple

API_PACKAGES = {
    "data": "Data: multi-epoch datasets, samplers, loaders, indexed files, tokenizers",
    "testing": "Testing: determinism checks for your own datasets",
    "model": "Models: GPT, BERT / ESM-2, T5, generation",
    "parallel": "Parallelism: device mesh, tensor / pipeline / data parallel",
    "train": "Training: configuration, trainer, steps",
    "convert": "Conversion: Hugging Face, Megatron-LM, NeMo checkpoints",
}
GENERATED = {
    "reference/options.md": lambda: options_page(),
    "reference/presets.md": lambda: presets_page(),
    "reference/cli.md": lambda: cli_page(),
    **{f"reference/api/{name}.md": (lambda name=name: api_page(name)) for name in API_PACKAGES},
}


# ----------------------------------------------------------------- mkdocs hook
def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, make in GENERATED.items():
        files.append(File.generated(config, path, content=make()))
    return files


# ------------------------------------------------------------------- options
class OptionRow(NamedTuple):
    """One configuration option: ``name`` (``section.key``), its type, default and meaning."""

    name: str
    type: str
    default: str
    description: str
    mirrors: tuple[str, ...]


_ENTRY = re.compile(r"^(?P<names>`*\w+`*(?:\s*[/,]\s*`*\w+`*)*)\s*:(?:\s+(?P<text>.*))?$")
_FLAG = re.compile(r"``(--[a-z][a-z0-9-]*)``")
_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc):`~?([^`]+)`")


def _attribute_docs(doc: str) -> dict[str, str]:
    """``{field: text}`` from a Google-style docstring's ``name: text`` entries.

    Entries sit at the indentation of the first line after ``Attributes:``; deeper
    lines continue them; ``a / b: text`` and ``a, b: text`` describe several fields;
    names ending a line with ``/`` continue on the next.
    """
    lines = doc.expandtabs().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:") + 1
    except StopIteration:
        return {}
    body = lines[start:]
    indent = next(len(x) - len(x.lstrip()) for x in body if x.strip())
    out: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for name in names:
            out.setdefault(name, " ".join(text).strip())

    i = 0
    while i < len(body):
        line = body[i]
        depth = len(line) - len(line.lstrip())
        stripped = line.strip()
        while stripped.endswith("/") and i + 1 < len(body):  # names continued on the next line
            i += 1
            stripped = f"{stripped} {body[i].strip()}"
        match = _ENTRY.match(stripped) if depth == indent else None
        if match:
            flush()
            names = [n.strip("` ") for n in re.split(r"[/,]", match["names"])]
            text = [match["text"] or ""]
        elif stripped and depth > indent and names:
            text.append(stripped)
        elif stripped:
            flush()
            names, text = [], []
        i += 1
    flush()
    return out


def _markdown(text: str) -> str:
    """Docstring text as Markdown for a table cell."""
    text = _ROLE.sub(
        lambda m: f"``{m[1].split('.')[-1] if '.' in m[1] and m[1][0].isupper() else m[1]}``", text
    )
    text = text.replace("``", "`")
    return text.replace("|", "\\|")


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_name(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(hint, "__name__", str(hint))


def _default(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("'", '"')


def _section_docs(section: str, cls: type) -> dict[str, str]:
    docs = _attribute_docs(cls.__doc__ or "")
    if section == "model":  # the [model] section holds ModelConfig's fields
        from epochal.model.config import ModelConfig

        docs = {**_attribute_docs(ModelConfig.__doc__ or ""), **docs}
    return docs


def option_rows() -> list[OptionRow]:
    """Every option of ``epochal train``, in the configuration's order.

    From :func:`epochal.train.config.options.describe_options` (the function behind
    ``epochal train --list-options``) where it exists, else read here from the same
    source: the configuration dataclasses and their docstrings. The default is the
    classes' own (no preset).
    """
    try:
        from epochal.train.config.options import describe_options
    except ImportError:
        return _rows_from_docstrings()
    rows = []
    for o in describe_options():
        flags = [
            f"Megatron-LM `{o.megatron}`" if o.megatron else "",
            f"BioNeMo `{o.bionemo}`" if o.bionemo else "",
        ]
        rows.append(
            OptionRow(
                o.name, o.type, _default(o.default), o.description, tuple(f for f in flags if f)
            )
        )
    return rows


def _rows_from_docstrings() -> list[OptionRow]:
    """:func:`option_rows` read directly from the configuration classes and their docstrings."""
    from epochal.train.config import TrainConfig

    root = TrainConfig()
    hints = typing.get_type_hints(TrainConfig)
    rows: list[OptionRow] = []
    for top in dataclasses.fields(TrainConfig):
        value = getattr(root, top.name)
        if not dataclasses.is_dataclass(value):
            doc = {"run_dir": "the run's folder: configuration, metrics, checkpoints, plots."}
            rows.append(
                OptionRow(
                    top.name,
                    _type_name(hints[top.name]),
                    _default(value),
                    doc.get(top.name, ""),
                    (),
                )
            )
            continue
        cls = type(value)
        docs = _section_docs(top.name, cls)
        section_hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            text = docs.get(f.name, "")
            rows.append(
                OptionRow(
                    f"{top.name}.{f.name}",
                    _type_name(section_hints[f.name]),
                    _default(getattr(value, f.name)),
                    text,
                    _mirrored_flags(f.name, text, shared=docs_shared(docs, text)),
                )
            )
    return rows


def docs_shared(docs: dict[str, str], text: str) -> bool:
    """Whether ``text`` describes several fields (an ``a / b: ...`` entry)."""
    return sum(1 for other in docs.values() if other is text or other == text) > 1


def _mirrored_flags(name: str, text: str, *, shared: bool) -> tuple[str, ...]:
    """The ``--flags`` a field's text names: all of them for a field described alone; for an
    entry shared by several fields, only the flag spelled like the field."""
    flags = tuple(dict.fromkeys(_FLAG.findall(text)))
    if not shared:
        return flags
    return tuple(f for f in flags if f[2:].replace("-", "_") == name)


def options_page() -> str:
    """The Markdown of ``reference/options.md``."""
    rows = option_rows()
    out = [
        "# Configuration options",
        "",
        "Every option of `epochal train`, generated from the configuration classes "
        "(`epochal.train.config`). Set one in a TOML file (`[section]` then `key = value`) "
        "or on the command line as `--section.key=value` (a TOML literal: "
        '`--training.train_iters=100`, `--data.data_path=\'["a", "b"]\'`). Later settings '
        "win: preset, then `--config` file, then the overrides.",
        "",
        "`epochal train --list-options [SECTION]` prints the same table in a terminal. "
        "The defaults below are the classes' own. A preset sets many of them "
        "(see [Presets](presets.md)); `epochal train --preset NAME --print-config` "
        "prints the resolved values of any combination.",
        "",
    ]
    section = None
    for row in rows:
        head = row.name.split(".")[0] if "." in row.name else "top level"
        if head != section:
            section = head
            title = f"`[{head}]`" if head != "top level" else "Top level"
            out += [
                "",
                f"## {title}",
                "",
                "| option | type | default | meaning | mirrors |",
                "|---|---|---|---|---|",
            ]
        mirrors = ", ".join(m if "`" in m else f"`{m}`" for m in row.mirrors)
        kind = row.type.replace("|", "\\|")
        out.append(
            f"| `{row.name}` | {kind} | `{row.default}` | "
            f"{_markdown(row.description) or '—'} | {mirrors} |"
        )
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------- presets
def _preset_descriptions() -> dict[str, str]:
    """``{name: text}`` from the ``- ``name``: text`` bullets of the presets module docstring."""
    from epochal.train.config import presets

    out: dict[str, str] = {}
    name = None
    for line in (presets.__doc__ or "").splitlines():
        match = re.match(r"^- ``([\w-]+)``: (.*)$", line)
        if match:
            name = match[1]
            out[name] = match[2]
        elif name and line.startswith("  ") and line.strip():
            out[name] += " " + line.strip()
        else:
            name = None
    return out


def _toml_lines(values: dict[str, Any], table: str = "") -> list[str]:
    from epochal.train.config.toml_io import _toml_value

    scalars = [f"{k} = {_toml_value(v)}" for k, v in values.items() if not isinstance(v, dict)]
    out = ([f"[{table}]"] if table and scalars else []) + scalars
    for key, value in values.items():
        if isinstance(value, dict):
            sub = _toml_lines(value, f"{table}.{key}" if table else key)
            out += ([""] if out else []) + sub
    return out


def presets_page() -> str:
    """The Markdown of ``reference/presets.md``: each preset's description and settings."""
    from epochal.train.config.presets import PRESETS

    described = _preset_descriptions()
    out = [
        "# Presets",
        "",
        "A preset is a starting configuration: `epochal train --preset NAME` (without "
        "`--preset` or `--config`: `tiny`). A `--config` file and `--section.key=value` "
        "overrides are merged over it, later ones winning, and an option you set replaces "
        "the preset's alternative to it (`--data.data_path` replaces a preset's "
        "`data.corpus`). `epochal train --preset NAME --print-config` prints the resolved "
        "configuration. Generated from `epochal.train.config.presets`.",
    ]
    for name, values in PRESETS.items():
        out += ["", f"## `{name}`", "", _markdown(described.get(name, "")), "", "```toml"]
        out += _toml_lines(values)
        out += ["```"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------ cli
def _help_text(argv: list[str]) -> str:
    from epochal.cli import main

    buffer = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
            main(argv)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return buffer.getvalue().rstrip()


def cli_page() -> str:
    """The Markdown of ``reference/cli.md``: ``epochal --help`` and each subcommand's."""
    from epochal.cli import SUBCOMMANDS

    out = [
        "# Command line",
        "",
        "What `epochal --help` and each `epochal COMMAND --help` print, generated from the "
        "command line itself.",
        "",
        "## `epochal`",
        "",
        "```text",
        _help_text(["--help"]),
        "```",
    ]
    for name in SUBCOMMANDS:
        out += ["", f"## `epochal {name}`", "", "```text", _help_text([name, "--help"]), "```"]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------ api
def api_page(package: str) -> str:
    """The Markdown of ``reference/api/<package>.md``: its exports, grouped by module."""
    module = importlib.import_module(f"epochal.{package}")
    exports: dict[str, str] = getattr(module, "_EXPORTS", {})
    by_module: dict[str, list[str]] = {}
    for name, where in exports.items():
        by_module.setdefault(where, []).append(name)
    out = [
        f"# `epochal.{package}`",
        "",
        f"{API_PACKAGES[package]}. Every name below is importable as "
        f"`from epochal.{package} import NAME`.",
        "",
        f"::: epochal.{package}",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "      show_root_toc_entry: false",
    ]
    for where, names in by_module.items():
        out += ["", f"## `{where}`", ""]
        for name in names:
            out += [f"::: epochal.{package}.{where}.{name}", ""]
    return "\n".join(out) + "\n"
