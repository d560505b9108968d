"""MkDocs hook: the reference pages generated from the code, so they cannot drift from it.

- ``reference/options.md``: every ``epochal train`` option (``--section.key=value``)
  with its type, default, meaning and the Megatron-LM / BioNeMo flag it mirrors;
- ``reference/presets.md``: every preset, its description and the settings it applies;
- ``reference/cli.md``: every subcommand's ``--help``, as ``epochal`` prints it;
- ``reference/api/<package>.md``: the public names of each package (its lazy
  ``_EXPORTS`` table), rendered by mkdocstrings from their docstrings.

The option rows come from :func:`epochal.train.config.options.describe_options`, the
function behind ``epochal train --list-options``: the configuration dataclasses' fields,
types and defaults, the meaning from each section's docstring, the flags they mirror.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
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


_ROLE = re.compile(r":(?:class|func|mod|meth|attr|data|exc):`~?([^`]+)`")


def _markdown(text: str) -> str:
    """Docstring text as Markdown for a table cell."""
    text = _ROLE.sub(
        lambda m: f"``{m[1].split('.')[-1] if '.' in m[1] and m[1][0].isupper() else m[1]}``", text
    )
    text = text.replace("``", "`")
    return text.replace("|", "\\|")


def _default(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("'", '"')


def option_rows() -> list[OptionRow]:
    """Every option of ``epochal train``, in the configuration's order, from
    :func:`epochal.train.config.options.describe_options` (what ``epochal train
    --list-options`` prints): the classes' defaults (no preset), their docstrings, and the
    Megatron-LM / BioNeMo flag each mirrors."""
    from epochal.train.config.options import describe_options

    rows = []
    for o in describe_options():
        flags = (
            f"Megatron-LM `{o.megatron}`" if o.megatron else "",
            f"BioNeMo `{o.bionemo}`" if o.bionemo else "",
        )
        rows.append(
            OptionRow(
                o.name, o.type, _default(o.default), o.description, tuple(f for f in flags if f)
            )
        )
    return rows


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
        mirrors = ", ".join(row.mirrors)
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
    from epochal.train.config.presets import PRESET_SUMMARIES, PRESETS

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
        summary = PRESET_SUMMARIES.get(name, "")
        out += ["", f"## `{name}`", "", f"**{summary}**" if summary else "", ""]
        out += [_markdown(described.get(name, "")), "", "```toml"]
        out += _toml_lines(values)
        out += ["```"]
    from epochal.data.sft.examples import CHAT_FILE  # package data: no machine's path

    return "\n".join(out).replace(str(CHAT_FILE.parent), "<epochal>/data/sft/examples") + "\n"


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
    from epochal._lazy import module_path

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
            out += [f"::: {module_path(f'epochal.{package}', where)}.{name}", ""]
    return "\n".join(out) + "\n"
