"""Two "nodes" on one machine: two torchrun launchers joined by c10d rendezvous.

Each launcher runs one worker (``--nnodes=2 --node-rank=R --nproc-per-node=1
--rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT``), the way a two-machine job is
started (README: "Many nodes"). The job trains data-parallel over the two nodes with
the losses of one process; a second two-node job resumes from the checkpoint the
first one wrote and continues with the uninterrupted run's losses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import free_port, kill_tree, run_process, start_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("train_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
DP2 = ["--parallel.data_parallel=2"]
#: no dropout, so that two data-parallel ranks and one process draw nothing different
NO_DROPOUT = [
    "--model.hidden_dropout=0",
    "--model.attention_dropout=0",
    "--training.device=cpu",  # gloo ranks on one machine: the same with or without a GPU
]


def two_nodes(run_dir: Path, iters: int, *extra: str) -> None:
    """Start both launchers (node 0 and node 1), wait for both; kill both on any failure."""
    port = free_port()
    procs = []
    try:
        for node in (0, 1):
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={node}",
                "--nproc-per-node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=epochal-two-nodes",
                WORKER,
                str(run_dir),
                str(iters),
                *DP2,
                *NO_DROPOUT,
                *extra,
            ]
            procs.append(start_process(cmd, env=ENV))
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-4000:]
    finally:
        for proc in procs:
            kill_tree(proc)


def train_losses(run_dir: Path) -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["kind"] == "train"
    }


def test_two_launchers_train_like_one_process_and_resume_each_others_checkpoints(tmp_path):
    single = tmp_path / "single"
    proc = run_process(
        [sys.executable, WORKER, str(single), "6", *NO_DROPOUT], env=ENV, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    reference = train_losses(single)
    assert sorted(reference) == list(range(1, 7))

    nodes = tmp_path / "nodes"
    two_nodes(nodes, 3)  # writes the step-3 checkpoint (both nodes' shards), then stops
    assert (nodes / "checkpoints" / "latest").read_text().strip() == "step_0000003"
    two_nodes(nodes, 6)  # a new two-node job resumes from it (resume="auto")
    records = [r for r in read_metrics(nodes / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        assert r["loss"] == pytest.approx(reference[r["step"]], abs=1e-5), r["step"]
    segments = [r for r in read_metrics(nodes / "metrics.jsonl") if r["kind"] == "segment"]
    assert segments[-1]["start_step"] == 3
