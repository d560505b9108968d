"""Fixtures of the documentation tests: a user's home directory and a page runner in it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs.page_runner import PageRunner


def user_environment(monkeypatch: pytest.MonkeyPatch, home: Path) -> dict[str, str]:
    """Make ``home`` the user's home (``~/.cache/epochal`` inside it); return the environment.

    In-process commands see ``os.environ`` (patched here); ``bash -c`` commands get the
    returned copy. Matplotlib keeps its real cache (a new home would rebuild its font list).
    """
    import matplotlib

    monkeypatch.setenv("MPLCONFIGDIR", matplotlib.get_cachedir())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("EPOCHAL_CACHE", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    return dict(os.environ)


@pytest.fixture
def make_runner(monkeypatch, capfd):
    """``make_runner(folder, home, rewrite=None)`` -> a :class:`PageRunner` for ``folder``."""

    def make(folder: Path, home: Path, rewrite=None) -> PageRunner:
        folder.mkdir(parents=True, exist_ok=True)
        env = user_environment(monkeypatch, home)
        runner = PageRunner(folder=folder, env=env, read_output=capfd.readouterr)
        if rewrite is not None:
            runner.rewrite = rewrite
        return runner

    return make
