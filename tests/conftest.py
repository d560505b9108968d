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
    """Tests marked ``gpu`` skip cleanly on a machine without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
