"""Session fixtures: the shared 2- and 4-process groups run every layout check once."""

from __future__ import annotations

import os

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import groups
from tests.parallel import harness as H

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def parallel_tmp(tmp_path_factory):
    """A folder shared by the groups (checkpoints)."""
    return tmp_path_factory.mktemp("parallel")


@pytest.fixture(scope="session")
def two_rank_results(parallel_tmp):
    """``{check: problems}`` of the 2-process group (a single-process checkpoint is written first)."""
    config = H.tiny_config()
    batches = H.global_batches(4, 8, seed=11)
    H.single_process_run(config, batches[:2], 2, save_dir=str(parallel_tmp / "single"))
    return run_gloo(groups.two_rank_group, 2, str(parallel_tmp), timeout=900)[0]


@pytest.fixture(scope="session")
def slow_two_rank_results(parallel_tmp):
    """``{check: problems}`` of the slow tier's 2-process group."""
    return run_gloo(groups.slow_two_rank_group, 2, str(parallel_tmp), timeout=900)[0]


@pytest.fixture(scope="session")
def four_rank_results(parallel_tmp):
    """``{check: problems}`` of the 4-process group (writes the TP2 x PP2 checkpoint)."""
    return run_gloo(groups.four_rank_group, 4, str(parallel_tmp), timeout=900)[0]
