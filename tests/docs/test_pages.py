"""Every documentation page follows the block conventions, and the pages outside the walk run.

The how-to and getting-started pages run in :mod:`tests.docs.test_new_user` (one home
directory, in order, as a new user would); every other page runs here, each in a fresh
folder (its python blocks in one namespace, its commands in document order).
"""

from __future__ import annotations

import pytest

from tests.docs.markdown_blocks import RUN_LANGUAGES, page_blocks
from tests.docs.site import DOCS, README, WALK_SECTIONS, nav_pages, source_pages

#: Languages a block may be written in: run (bash, python) or shown.
SHOWN = {"text", "toml", "yaml", "json", "console"}

PER_PAGE = [path for section, path in nav_pages() if section not in WALK_SECTIONS]
PER_PAGE = [path for path in PER_PAGE if (DOCS / path).is_file()]


@pytest.mark.parametrize("page", [README, *source_pages()], ids=lambda p: p.name)
def test_blocks_follow_the_conventions(page):
    for block in page_blocks(page):  # raises on an unclosed fence or a stray marker
        assert block.lang in (*RUN_LANGUAGES, *SHOWN), f"{block.where}: language {block.lang!r}"
        if block.skip is not None:
            assert block.skip.strip(), f"{block.where}: 'not run' needs a reason"
            assert block.lang in RUN_LANGUAGES, f"{block.where}: only bash/python blocks run"
        if block.file is not None:
            assert block.file.strip() and not block.file.startswith("/"), block.where


#: pages whose commands a test of their own also runs (tests/parallel/test_layout_invariance.py)
SLOW_PAGES = {
    "concepts/layout-invariance.md",
    "coming-from/accelerate.md",  # its example scripts run in tests/accelerate
    "reference/run-checks.md",  # the run checks have tests of their own (tests/train)
}


@pytest.mark.parametrize(
    "page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in PER_PAGE]
)
def test_page_runs(page, tmp_path_factory, make_runner):
    home = tmp_path_factory.getbasetemp() / "docs-home"  # one cache for these pages
    runner = make_runner(tmp_path_factory.mktemp("page"), home)
    for _ in runner.run_page(DOCS / page):
        pass
