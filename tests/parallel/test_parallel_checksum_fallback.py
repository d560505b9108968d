"""Two torchrun ranks resume past a damaged checkpoint together (issue 15, item 2).

Rank 1's ``.distcp`` of the newest step gets 8 flipped bytes: rank 0 verifies the
checksums of every rank's files and broadcasts its choice, so both ranks skip to
the previous step (one warning), and the losses after it equal the first run's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import run_process
from tests.train.test_checkpoint_integrity import flip

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("train_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _run(run_dir: Path) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        WORKER,
        str(run_dir),
        "6",
    ]
    proc = run_process(cmd, env=ENV, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def test_both_ranks_fall_back_to_the_newest_intact_step(tmp_path):
    _run(tmp_path)  # dp 2, checkpoints at steps 3 and 6
    step6 = tmp_path / "checkpoints" / "step_0000006"
    damaged = step6 / "__1_0.distcp"  # written by rank 1
    flip(damaged)
    proc = _run(tmp_path)
    assert proc.stderr.count("checkpoint skipped as damaged") == 1, proc.stderr[-4000:]
    assert f"{damaged}: damaged" in proc.stderr
    losses: dict[int, dict[int, float]] = {}
    for r in read_metrics(tmp_path / "metrics.jsonl"):
        if r["kind"] == "train":
            losses.setdefault(r["segment"], {})[r["step"]] = r["loss"]
    assert sorted(losses) == [0, 1]
    assert sorted(losses[1]) == [4, 5, 6]  # resumed after step 3
    assert all(losses[1][s] == losses[0][s] for s in (4, 5, 6)), losses
    assert (tmp_path / "checkpoints" / "damaged-step_0000006" / "__1_0.distcp").is_file()
