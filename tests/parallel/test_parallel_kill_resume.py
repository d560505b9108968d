"""Kill a TP2 x DP2 torchrun job with SIGKILL mid-run and resume it: later losses equal the uninterrupted run's.

The trainer issue's kill-and-resume test, under tensor + data parallelism (4
processes, dropout on, a distributed checkpoint written by all ranks).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import kill_tree, run_process, start_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("train_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ITERS = 9
LAYOUT = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--parallel.tensor_parallel=2",
    "--parallel.sequence_parallel=true",
    "--parallel.dp_sharding=optimizer",
]


def _cmd(run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        WORKER,
        str(run_dir),
        str(ITERS),
        *args,
        *LAYOUT,
    ]


def _run(run_dir: Path) -> None:
    proc = run_process(_cmd(run_dir), env=ENV, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def _losses(run_dir: Path) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == "train":
            out.setdefault(r["segment"], {})[r["step"]] = r["loss"]
    return out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tp2dp2_full")
    _run(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tp2dp2_killed")
    proc = start_process(_cmd(run_dir, "--pause-after", "7"), env=ENV)
    markers = [run_dir / f"paused_rank{r}" for r in range(4)]
    deadline = time.monotonic() + 300
    try:
        while not all(m.exists() for m in markers):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the job never reached step 7"
            time.sleep(0.1)
    finally:
        kill_tree(proc)  # SIGKILL torchrun and every worker (each in a session of its own)
    ckpts = sorted(
        p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_")
    )
    assert ckpts == ["step_0000003", "step_0000006"]
    _run(run_dir)  # resume="auto" continues from step 6
    return run_dir


def test_tp2_dp2_resumed_losses_equal_uninterrupted_exactly(uninterrupted, killed_and_resumed):
    full = _losses(uninterrupted)
    assert list(full) == [0] and sorted(full[0]) == list(range(1, ITERS + 1))
    got = _losses(killed_and_resumed)
    assert sorted(got) == [0, 1]
    assert sorted(got[0]) == list(range(1, 8))  # killed after step 7
    assert sorted(got[1]) == list(range(7, ITERS + 1))  # resumed after checkpoint 6
    for seg in (0, 1):
        for step, loss in got[seg].items():
            assert loss == full[0][step], (seg, step, loss, full[0][step])
