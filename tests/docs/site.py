"""Where the documentation lives and what the site's navigation lists, for the docs tests."""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS_YML = ROOT / "mkdocs.yml"
HOOK = DOCS / "_hooks" / "reference.py"

#: The pages the new-user walk runs, after the quick start and the README: every how-to page.
WALK_SECTIONS = ("Getting started", "How-to")


def _nav_pages(node: object, section: str = "") -> list[tuple[str, str]]:
    """``(section, page path)`` of every page of a ``nav`` node, in order."""
    if isinstance(node, str):
        return [(section, node)]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item, section)]
    if isinstance(node, dict):
        return [p for key, value in node.items() for p in _nav_pages(value, section or key)]
    return []


def nav_pages() -> list[tuple[str, str]]:
    """``(top-level section, path under docs/)`` of every page in ``mkdocs.yml``'s nav, in order."""
    config = yaml.safe_load(MKDOCS_YML.read_text())
    return _nav_pages(config["nav"])


def generated_pages() -> set[str]:
    """The pages the MkDocs hook generates (they have no file under ``docs/``)."""
    return set(reference_hook().GENERATED)


def source_pages() -> list[Path]:
    """Every Markdown file under ``docs/`` (the hook's folder excluded)."""
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


@cache
def reference_hook() -> ModuleType:
    """The MkDocs hook module that generates the reference pages."""
    spec = importlib.util.spec_from_file_location("epochal_docs_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
