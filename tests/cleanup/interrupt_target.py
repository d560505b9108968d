"""Tests that start workers which never end by themselves; ``test_cleanup.py`` runs and interrupts them.

Not collected by the normal run (the file name does not start with ``test_``).
The folder for the workers' pid files comes from ``EPOCHAL_CLEANUP_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.cleanup import sleepy_worker
from tests.dist_utils import run_gloo, run_torchrun

FOLDER = os.environ.get("EPOCHAL_CLEANUP_DIR", "")


def test_torchrun_workers():
    run_torchrun([str(Path(sleepy_worker.__file__)), FOLDER], 2, timeout=600)


def test_gloo_ranks():
    run_gloo(sleepy_worker.gloo_rank, 2, FOLDER, timeout=600)
