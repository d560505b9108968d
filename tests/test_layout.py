"""The shape of ``src/epochal``: no import circle between files, dependencies one way, small files.

Read with :mod:`ast` only (no module is imported). Every ``import`` statement of every
file counts, those inside functions included (a lazy import is still a dependency);
string imports (``importlib.import_module``, the lazy-export maps of package
``__init__`` files, the subcommand table of ``cli.py``) are not followed. An import
resolves to a file: ``epochal.x`` to ``x.py`` or ``x/__init__.py``; ``from epochal.x
import name`` to the submodule ``x/name.py`` (or ``x/name/__init__.py``) when there is
one, else to ``epochal.x``; relative imports as Python resolves them.

The direction (DESIGN.md, "Dependencies point one way"): a file's *layer* is its
top-level package under ``epochal/`` (``data``, ``model``, ...) or, for a top-level
module, its name (``cli``); the private helpers ``_atomic``, ``_checksum``, ``_lazy``, ``_paths``,
``_text``, ``_dcp``, ``_env`` (checked numeric environment variables), ``_ownership`` (which
writer owns a path), ``_eager`` (functions ``torch.compile`` leaves alone), ``_fast_exit`` (a finished command's
exit), ``_checks`` (option checks and ``ConfigError``), ``_masked_mean`` (the one masked mean of losses) and ``epochal/__init__.py`` are the *base* that every layer may use, and import no
layer. Each layer may import itself, the base and:

    data      nothing else (usable on its own under Megatron-Core, NeMo, Lightning)
    testing   data (determinism checks that users run on their datasets)
    model     data (plain PyTorch models; no parallelism, no training)
    parallel  model, data (applies parallelism from outside to a plain model)
    formats   model, data (checkpoint formats read and written as our models'
              ``(config, state_dict)``: Hugging Face folders, safe loading, bounded
              parsing, checked configs; the trainer reads Hugging Face encoders with them
              for ``checkpoint.init_from``, the converters everything)
    train     formats, parallel, model, data
    convert   formats, train, model, data (checkpoint conversion: our models' state-dict
              names and configs, epochal's checkpoint format and run configuration
              in ``train/``, the tokenizers in ``data/``); it applies no parallelism
    accelerate  formats, convert, train, parallel, model, data (Hugging Face Accelerate's
              API over the trainer: a front end beside ``commands``)
    commands  every layer but ``cli`` (thin: parse, call the library, print)
    cli       commands

so ``commands / accelerate -> convert -> train -> parallel -> model``, with ``formats`` below
``train`` and ``convert``, everything may use ``data``,
and nothing but ``commands`` and ``cli`` imports ``commands``. Library code never
imports ``testing`` (that is for users' test suites).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "epochal"
MAX_LINES = 600

BASE = frozenset(
    {
        "epochal",
        "_atomic",
        "_checksum",
        "_lazy",
        "_paths",
        "_text",
        "_dcp",
        "_env",
        "_ownership",
        "_eager",
        "_fast_exit",
        "_checks",
        "_masked_mean",
    }
)
#: layer -> the other layers it may import (itself and the base are always allowed).
ALLOWED: dict[str, frozenset[str]] = {
    "data": frozenset(),
    "testing": frozenset({"data"}),
    "model": frozenset({"data"}),
    "parallel": frozenset({"model", "data"}),
    "formats": frozenset({"model", "data"}),
    "train": frozenset({"formats", "parallel", "model", "data"}),
    "convert": frozenset({"formats", "train", "model", "data"}),
    "accelerate": frozenset({"convert", "formats", "train", "parallel", "model", "data"}),
    "commands": frozenset(
        {"accelerate", "convert", "formats", "train", "parallel", "model", "data", "testing"}
    ),
    "cli": frozenset({"commands"}),
}


def module_files(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package at ``src``.

    A package's name maps to its ``__init__.py``.
    """
    root = src.parent
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported_names(tree: ast.AST, package: str, modules: dict[str, Path]) -> set[str]:
    """The dotted names a module's import statements refer to (its own package ``package``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 > len(parts) - 1:
                    continue  # beyond the top-level package: not ours
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if sub in modules else base)
    return names


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package that it imports (itself excluded).

    Args:
        src: the top-level package folder (``src/epochal``).

    Raises:
        SyntaxError: a file does not parse.
    """
    modules = module_files(src)
    top = src.name
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for imported in _imported_names(ast.parse(path.read_text(), str(path)), package, modules):
            if imported != top and not imported.startswith(top + "."):
                continue
            while imported not in modules:  # epochal.x.y.NAME where NAME is not a module
                imported = imported.rpartition(".")[0]
            if imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One import circle per strongly connected group of modules, as a path ``a, b, ..., a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm, iterative over the edges of v
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in groups:
        start = min(group)
        # breadth-first: the shortest way back to ``start`` inside the group
        previous: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in previous:
            following = []
            for v in frontier:
                for w in sorted(graph[v] & group):
                    if w not in previous:
                        previous[w] = v
                        following.append(w)
            frontier = following
        path = [start]
        v = previous[start]
        while v != start:
            path.append(v)
            v = previous[v]
        path.append(start)
        cycles.append(path[::-1])
    return sorted(cycles)


def layer(module: str) -> str:
    """``epochal.data.loading.samplers`` -> ``data``; ``epochal.cli`` -> ``cli``; ``epochal`` ->
    ``epochal``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def arrows_against(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import whose layers :data:`ALLOWED` does not permit."""
    wrong = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            la, lb = layer(a), layer(b)
            if la == lb or lb in BASE:
                continue
            if la in BASE or lb not in ALLOWED.get(la, frozenset()):
                wrong.append(f"{a} -> {b} ({la} may not import {lb})")
    return wrong


def code_lines(text: str) -> int:
    """Lines of ``text`` that hold code: not blank, not only a comment, not in a docstring.

    A docstring is the first statement of a module, class or function when it is a string
    constant (all its lines).
    """
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return sum(
        1
        for number, line in enumerate(text.splitlines(), 1)
        if number not in doc and line.strip() and not line.strip().startswith("#")
    )


def long_files(src: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: lines`` of every file over ``limit`` lines of code (:func:`code_lines`)."""
    out = []
    for path in sorted(src.rglob("*.py")):
        n = code_lines(path.read_text())
        if n > limit:
            out.append(f"{path.relative_to(src.parent)}: {n} lines of code")
    return out


# ----------------------------------------------------------------------------- the real tree
@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC)


def test_no_import_circle_between_files(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_dependencies_point_one_way(graph):
    wrong = arrows_against(graph)
    assert not wrong, "imports against the direction in DESIGN.md:\n" + "\n".join(wrong)


def test_every_layer_is_known(graph):
    layers = {layer(m) for m in graph} - BASE
    assert layers <= set(ALLOWED), f"layers without a rule: {sorted(layers - set(ALLOWED))}"


def test_no_file_over_600_lines_of_code():
    assert not long_files(SRC), "files over 600 lines of code:\n" + "\n".join(long_files(SRC))


def test_graph_sees_the_real_imports(graph):
    """The reader finds known edges (a checker that reads nothing would pass everything)."""
    assert "epochal.model.generation.search" in graph["epochal.model.generation.decoding"]
    # an import inside a function (the only one of this module to that file)
    assert "epochal.data.indexed.indexed_dataset" in graph["epochal.data.datasets.dataset_builder"]
    assert sum(len(v) for v in graph.values()) > 300
    # the trainer reads Hugging Face encoders from the formats layer, not from convert
    assert "epochal.formats.hf.io" in graph["epochal.train.state.encoder_init"]
    assert layer("epochal.formats.hf.io") == "formats"


# ----------------------------------------------------------------------------- the checker
def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "epochal"


def test_checker_resolves_relative_submodule_and_function_imports(tmp_path):
    src = _tree(
        tmp_path,
        {
            "epochal/__init__.py": "",
            "epochal/data/__init__.py": "from .indexed import reader\n",
            "epochal/data/indexed/__init__.py": "",
            "epochal/data/indexed/reader.py": "from ..epochs import EpochIndex\n",
            "epochal/data/epochs.py": "EpochIndex = int\n",
            "epochal/model/__init__.py": "",
            "epochal/model/gpt.py": (
                "import torch\n"
                "from epochal.data import epochs\n"
                "def f():\n    import epochal.data.indexed.reader as r\n    from . import layers\n"
            ),
            "epochal/model/layers.py": "from epochal.model.gpt import f\n",
        },
    )
    graph = import_graph(src)
    assert graph["epochal.data"] == {"epochal.data.indexed.reader"}
    assert graph["epochal.data.indexed.reader"] == {"epochal.data.epochs"}
    assert graph["epochal.model.gpt"] == {
        "epochal.data.epochs",
        "epochal.data.indexed.reader",
        "epochal.model.layers",
    }
    assert find_cycles(graph) == [
        ["epochal.model.gpt", "epochal.model.layers", "epochal.model.gpt"]
    ]
    assert arrows_against(graph) == []


def test_checker_finds_a_circle_and_wrong_arrows(tmp_path):
    src = _tree(
        tmp_path,
        {
            "epochal/__init__.py": "",
            "epochal/_atomic.py": "",
            "epochal/data/__init__.py": "",
            "epochal/data/a.py": "from epochal.data.b import x\nfrom epochal import _atomic\n",
            "epochal/data/b.py": "def x():\n    from epochal.data.c import y\n",
            "epochal/data/c.py": "from epochal.data import a\nfrom epochal.model.gpt import G\n",
            "epochal/model/__init__.py": "",
            "epochal/model/gpt.py": "from epochal.parallel import plan\nG = 1\n",
            "epochal/parallel/__init__.py": "",
            "epochal/parallel/plan.py": "from epochal.model.gpt import G\n",
            "epochal/train/__init__.py": "",
            "epochal/train/loop.py": "from epochal.commands import run\n",
            "epochal/commands/__init__.py": "",
            "epochal/commands/run.py": "from epochal.train import loop\n",
        },
    )
    graph = import_graph(src)
    cycles = find_cycles(graph)
    assert ["epochal.data.a", "epochal.data.b", "epochal.data.c", "epochal.data.a"] in cycles
    assert ["epochal.model.gpt", "epochal.parallel.plan", "epochal.model.gpt"] in cycles
    assert ["epochal.commands.run", "epochal.train.loop", "epochal.commands.run"] in cycles
    assert arrows_against(graph) == [
        "epochal.data.c -> epochal.model.gpt (data may not import model)",
        "epochal.model.gpt -> epochal.parallel.plan (model may not import parallel)",
        "epochal.train.loop -> epochal.commands.run (train may not import commands)",
    ]


def test_checker_finds_long_files(tmp_path):
    src = _tree(tmp_path, {"epochal/__init__.py": "", "epochal/big.py": "x = 1\n" * 601})
    assert long_files(src) == ["epochal/big.py: 601 lines of code"]
    assert long_files(src, limit=601) == []


def test_docstrings_comments_and_blank_lines_are_not_code():
    text = (
        '"""A module\n\nwith a docstring."""\n\n# a comment\nx = 1  # code with a comment\n'
        'class A:\n    """Its docstring."""\n\n    def f(self):\n        """One\n        more."""\n'
        "        return 2\n"
    )
    assert code_lines(text) == 4  # x = 1, class A:, def f, return 2
