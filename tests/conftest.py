"""Shared pytest configuration."""

import os
import signal

import pytest
import torch

# Two cores: keep each process from oversubscribing them.
torch.set_num_threads(min(2, torch.get_num_threads()))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def cuda_only():
    """Skip the test cleanly when no CUDA device is present."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def _sigterm_as_ctrl_c(signum, frame):
    raise KeyboardInterrupt(f"pytest got signal {signal.Signals(signum).name}")


def pytest_configure(config):
    """SIGTERM to pytest unwinds like Ctrl-C, so every ``finally`` kills its workers.

    (Python's default for SIGTERM ends the process at once, skipping them; see
    ``tests/dist_utils.py``.)
    """
    signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip cleanly without CUDA; ``slow`` ones unless EPOCHAL_SLOW_TESTS=1.

    The ``slow`` tier (long multi-process runs: kill -9 under four ranks, two launchers,
    the pty wizard, more layouts of what other tests check) keeps the default run within
    CI's time; ``EPOCHAL_SLOW_TESTS=1 python -m pytest -q`` runs everything.
    """
    skips = []
    if not torch.cuda.is_available():
        skips.append(("gpu", pytest.mark.skip(reason="needs CUDA (marked gpu)")))
    if os.environ.get("EPOCHAL_SLOW_TESTS", "") in ("", "0"):
        skips.append(("slow", pytest.mark.skip(reason="slow: EPOCHAL_SLOW_TESTS=1 runs it")))
    for item in items:
        for marker, skip in skips:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
