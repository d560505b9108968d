"""Kill -9 a DP4 run on a scheduled blend at step 23, resume on DP2 without loader workers.

The uninterrupted DP4 run (two loader workers per rank) and the resumed one read the
same samples at every later step (per-step digests and per-source counts) and compute
the same losses (one thread per process: the layout-invariant reduction makes DP4
and DP2 bit-equal).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.dist_utils import kill_tree, run_process, start_process
from tests.train.test_blend_schedule_training import STEPS, corpora, options, records  # noqa: F401

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("blend_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _cmd(ranks: int, run_dir: Path, cache: Path, prefixes, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        WORKER,
        str(run_dir),
        *extra,
        *options(prefixes, run_dir, cache),
        "--training.micro_batch_size=2",
    ]


def _run(cmd: list[str]) -> None:
    proc = run_process(cmd, env=ENV, timeout=500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_dp4_killed_at_step_23_resumes_on_dp2_exactly(corpora, tmp_path):  # noqa: F811
    cache = tmp_path / "cache"
    full = tmp_path / "full"
    _run(_cmd(4, full, cache, corpora, "--data.num_workers=2"))
    killed = tmp_path / "killed"
    proc = start_process(
        _cmd(4, killed, cache, corpora, "--pause-after", "23", "--data.num_workers=2"), env=ENV
    )
    markers = [killed / f"paused_rank{r}" for r in range(4)]
    deadline = time.monotonic() + 400
    try:
        while not all(m.exists() for m in markers):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the job never reached step 23"
            time.sleep(0.2)
    finally:
        kill_tree(proc)  # SIGKILL torchrun and every worker
    _run(_cmd(2, killed, cache, corpora, "--data.num_workers=0"))
    a, b = records(full), records(killed)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in range(24, STEPS + 1):
        assert b[step]["segment"] == 1, step  # trained after the resume
        assert b[step]["sample_digest"] == a[step]["sample_digest"], step
        assert b[step]["sources"] == a[step]["sources"], step
        assert b[step]["loss"] == a[step]["loss"], step
