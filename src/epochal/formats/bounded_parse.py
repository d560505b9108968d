"""Read checkpoint configuration files (JSON, YAML) with bounded size, nesting and expansion.

A configuration file of a checkpoint (Hugging Face ``config.json`` and index files,
NeMo ``model.yaml`` / ``io.json``, ``--model-config``) is data from somewhere else, so
reading it is bounded:

- **size**: at most :func:`max_config_bytes` bytes (8 MiB by default; the
  ``EPOCHAL_MAX_CONFIG_BYTES`` environment variable overrides it), checked with
  ``stat`` before the file is read;
- **nesting**: at most :data:`MAX_DEPTH` levels of mappings and lists (a parser's own
  ``RecursionError`` on deeper input is reported the same way);
- **expansion**: YAML aliases are kept as shared references by the loader, so a
  "billion laughs" document loads small but expands exponentially when walked;
  :func:`check_tree` walks the loaded value counting every node as if expanded and
  refuses more than :data:`MAX_NODES`. The same budget bounds any other graph walk
  (:class:`Budget`, e.g. Fiddle's ``io.json`` references).

Every refusal is a :class:`ConfigFileError` (a :class:`ValueError`) naming the file
and the limit.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from epochal._env import env_int

__all__ = [
    "MAX_DEPTH",
    "MAX_NODES",
    "Budget",
    "ConfigFileError",
    "check_tree",
    "load_json_file",
    "load_yaml_file",
    "max_config_bytes",
    "read_config_text",
]

#: default size cap of a configuration file, bytes (``EPOCHAL_MAX_CONFIG_BYTES`` overrides).
DEFAULT_MAX_CONFIG_BYTES = 8 * 1024 * 1024
#: deepest nesting of mappings/lists accepted in a configuration file.
MAX_DEPTH = 100
#: most nodes a configuration may expand to (aliases and references counted each time).
MAX_NODES = 1_000_000
ENV_MAX_BYTES = "EPOCHAL_MAX_CONFIG_BYTES"


class ConfigFileError(ValueError):
    """A configuration file is over a limit, malformed or not the expected shape (names it)."""


def max_config_bytes() -> int:
    """The size cap of configuration files: ``$EPOCHAL_MAX_CONFIG_BYTES`` or 8 MiB.

    Raises:
        ConfigFileError: the environment variable is set but not an integer from 1 to
            ``sys.maxsize`` (the message names it and the range).
    """
    return env_int(
        ENV_MAX_BYTES,
        DEFAULT_MAX_CONFIG_BYTES,
        minimum=1,
        maximum=sys.maxsize,
        unit="bytes",
        error=ConfigFileError,
    )


def read_config_text(path: str | os.PathLike, what: str = "configuration") -> str:
    """The text of ``path`` after checking its size against :func:`max_config_bytes`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigFileError: larger than the cap (the message names the cap and how to raise
            it), not UTF-8, or unreadable.
    """
    path = Path(path)
    limit = max_config_bytes()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing {what} file") from None
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the {what} ({exc})") from exc
    if size > limit:
        raise ConfigFileError(
            f"{path}: the {what} is {size} bytes, over the {limit}-byte limit for configuration "
            f"files (set {ENV_MAX_BYTES} to raise it)"
        )
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the {what} ({exc})") from exc
    if len(data) > limit:  # grew since stat
        raise ConfigFileError(f"{path}: the {what} is over the {limit}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(f"{path}: the {what} is not UTF-8 text ({exc})") from exc


class Budget:
    """Counts nodes visited by a walk and refuses beyond a limit or depth.

    Args:
        source: the file named in errors.
        max_nodes: most visits allowed.
        max_depth: deepest nesting allowed.
    """

    def __init__(self, source: str, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH):
        self.source = source
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.nodes = 0

    def visit(self, depth: int) -> None:
        """Count one node at nesting ``depth``.

        Raises:
            ConfigFileError: over the node budget or the depth limit.
        """
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise ConfigFileError(
                f"{self.source}: expands to more than {self.max_nodes} values (aliases or "
                "references repeated exponentially?); refused"
            )
        if depth > self.max_depth:
            raise ConfigFileError(f"{self.source}: nests deeper than {self.max_depth} levels")


def check_tree(value: Any, source: str, *, budget: Budget | None = None) -> None:
    """Walk ``value`` (dicts, lists, scalars) as if expanded, within :class:`Budget` limits.

    Shared sub-objects (YAML aliases) are walked every time they occur, so an
    exponential document is refused after :data:`MAX_NODES` nodes, not expanded.

    Raises:
        ConfigFileError: too many nodes or too deep (names ``source`` and the limit).
    """
    budget = budget or Budget(source)
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        budget.visit(depth)
        if isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((v, depth + 1) for v in node)


def load_json_file(
    path: str | os.PathLike, what: str = "configuration", *, mapping: bool = True
) -> Any:
    """A JSON file read within the size, depth and node limits.

    Args:
        mapping: require a JSON object at the top.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigFileError: over a limit, not valid JSON, or not an object (with ``mapping``).
    """
    text = read_config_text(path, what)
    try:
        data = json.loads(text)
    except RecursionError:
        raise ConfigFileError(f"{path}: the {what} nests deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ConfigFileError(f"{path}: the {what} is not valid JSON ({exc})") from exc
    check_tree(data, str(path))
    if mapping and not isinstance(data, dict):
        raise ConfigFileError(f"{path}: the {what} is not a JSON object")
    return data


def load_yaml_file(path: str | os.PathLike, what: str = "configuration") -> Any:
    """A YAML (or JSON) file read with ``yaml.safe_load`` within the size, depth and node limits.

    ``safe_load`` constructs plain data only (no Python objects); aliases become
    shared references, which :func:`check_tree` counts as expanded.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ConfigFileError: over a limit.
        yaml.YAMLError: not plain YAML (the caller words the refusal).
    """
    import yaml

    text = read_config_text(path, what)
    try:
        doc = yaml.safe_load(text)
    except RecursionError:
        raise ConfigFileError(f"{path}: the {what} nests deeper than {MAX_DEPTH} levels") from None
    check_tree(doc, str(path))
    return doc
