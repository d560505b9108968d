"""The documentation site builds strictly; the README fits a screen; the reference covers every option."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.markdown_blocks import command_lines, page_blocks
from tests.docs.site import (
    DOCS,
    README,
    ROOT,
    generated_pages,
    nav_pages,
    reference_hook,
    source_pages,
)

OPTION = re.compile(
    r"(?<![\w./-])(?:--)?((?:run_dir)|(?:model|data|training|optimizer|scheduler|checkpoint|"
    r"logging|parallel|finetune|sft)\.[a-z][a-z0-9_]*)(?![\w(*])"
)
#: Python names and file names the pages write like options (a model's or optimizer's methods, Accelerate's files).
NOT_OPTIONS = {
    "optimizer.step",
    "optimizer.zero_grad",
    "model.generate",
    "optimizer.param_groups",
    "scheduler.bin",
    "optimizer.bin",
    "model.safetensors",
}


def test_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: no broken link, anchor or API reference, no page left out of the nav."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    options = (site / "reference" / "options" / "index.html").read_text()
    assert "training.train_iters" in options and "parallel.tensor_parallel" in options
    assert "usage: epochal train" in (site / "reference" / "cli" / "index.html").read_text()
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert "Index mapping: EpochIndex resampler" in benchmarks  # BENCHMARKS.md, included


def test_nav_lists_every_page_once():
    listed = [path for _, path in nav_pages()]
    assert len(listed) == len(set(listed)), "a page is twice in mkdocs.yml's nav"
    on_disk = {p.relative_to(DOCS).as_posix() for p in source_pages()}
    assert set(listed) == on_disk | generated_pages()


def test_readme_is_short_and_its_commands_are_the_ci_s():
    """At most ~150 lines; ``.ci/run`` runs the README's install and test commands."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    blocks = [b for b in page_blocks(README) if b.lang == "bash"]
    commands = [c for b in blocks for c in command_lines(b.code)]
    assert "python -m pytest -q" in commands and ci[-1] == "python -m pytest -q"
    setup = next(c for c in commands if c.startswith("pip install torch"))
    for step in setup.split(" && "):
        if step.startswith("pip install"):
            assert any(step.replace("pip install", "-m pip install --quiet") in line for line in ci)


def test_the_install_page_gives_the_cpu_wheel_of_the_pinned_torch():
    """Next to the README's pinned torch, the command for PyTorch's CPU-only wheel index."""
    pinned = re.search(r"pip install (torch==[\w.]+)", README.read_text()).group(1)
    page = (DOCS / "getting-started" / "install.md").read_text()
    assert f"pip install {pinned} && " in page
    cpu = f"pip install {pinned} --index-url https://download.pytorch.org/whl/cpu"
    assert cpu in " ".join(page.split())


def test_readme_links_every_how_to_page():
    """The README's how-to list names every page of the site's How-to section."""
    linked = set(re.findall(r"\]\(docs/([^)#]+)", README.read_text()))
    how_to = [path for section, path in nav_pages() if section == "How-to"]
    assert how_to and [p for p in how_to if p not in linked] == []


def test_the_option_reference_covers_every_option_with_a_description():
    from epochal.train.config import TrainConfig

    expected = []
    root = TrainConfig()
    for top in dataclasses.fields(TrainConfig):
        value = getattr(root, top.name)
        if dataclasses.is_dataclass(value):
            expected += [f"{top.name}.{f.name}" for f in dataclasses.fields(value)]
        else:
            expected.append(top.name)
    rows = reference_hook().option_rows()
    assert [r.name for r in rows] == expected
    assert [r.name for r in rows if not r.description] == []
    page = reference_hook().options_page()
    assert all(f"`{name}`" in page for name in expected)


def test_options_named_in_the_docs_exist():
    """Every ``section.key`` the pages and the README name (outside Python code) is an option."""
    known = {r.name for r in reference_hook().option_rows()}
    unknown = []
    for page in [README, *source_pages()]:
        text = page.read_text()
        for block in page_blocks(page):
            if block.lang == "python":
                text = text.replace(block.code, "")
        names = set(OPTION.findall(text)) - NOT_OPTIONS
        unknown += [f"{page.name}: {m}" for m in sorted(names) if m not in known]
    assert unknown == []


def test_cli_reference_has_every_subcommand():
    from epochal.cli import SUBCOMMANDS

    page = reference_hook().cli_page()
    for name in SUBCOMMANDS:
        assert f"## `epochal {name}`" in page and f"usage: epochal {name}" in page
    assert Path(DOCS / "_hooks" / "reference.py").is_file()
