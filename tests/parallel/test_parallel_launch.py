"""``epochal train`` launches itself under torchrun when the layout needs it, and runs unchanged under one."""

from __future__ import annotations

import json
import os
import sys

import pytest

from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import run_process

pytestmark = pytest.mark.distributed

ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "EPOCHAL_RELAUNCHED")
}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
TINY = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    "--data.seq_length=32",
    "--model.vocab_size=256",
    "--model.hidden_size=32",
    "--model.num_layers=3",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--training.train_iters=2",
    "--training.micro_batch_size=1",
    "--training.global_batch_size=4",
    "--training.eval_interval=0",
    "--training.eval_iters=1",
    "--scheduler.lr_warmup_iters=0",
    "--checkpoint.save_interval=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def _single_process_losses(run_dir, model_overrides: list[str]) -> list[float]:
    """The same configuration trained by the single-process Trainer (no dropout in TINY)."""
    from epochal.train.config import build_config
    from epochal.train.trainer import Trainer

    cfg = build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *TINY, *model_overrides])
    return Trainer(cfg, log=False).train().losses


def _check_run(run_dir, proc, layout: str, model_overrides: list[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert out.count("trained steps 1-2") == 1, out  # one rank logs
    assert f"layout {layout}" in out, out
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    # every rank read the right batches (TP ranks the same ones, a middle stage none)
    expected = _single_process_losses(run_dir.parent / "single", model_overrides)
    assert [r["loss"] for r in train] == pytest.approx(expected, abs=1e-5)
    state = json.loads(
        (run_dir / "checkpoints" / "step_0000002" / "trainer_state.json").read_text()
    )
    assert state["consumed_train_samples"] == 8


@pytest.mark.slow  # relaunching: the preemption test's ground (DP2); TP2 through the trainer: the invariance tests'
def test_epochal_train_relaunches_itself_for_tensor_parallel(tmp_path):
    run_dir = tmp_path / "tp2"
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *TINY,
        "--model.num_layers=2",
        "--parallel.tensor_parallel=2",
        "--parallel.sequence_parallel=true",
    ]
    proc = run_process(cmd, env=ENV, timeout=400, cwd=tmp_path)
    assert "launching 2 processes" in proc.stdout
    _check_run(run_dir, proc, "TP2 x PP1 x DP1", ["--model.num_layers=2"])


@pytest.mark.slow  # the launch count itself is tested in-process (tests/train/test_launch_layouts.py)
def test_epochal_train_relaunches_itself_for_expert_parallel_alone(tmp_path):
    # expert-parallel ranks are data-parallel ranks: EP2 alone runs DP2 x EP2 on 2 processes
    run_dir = tmp_path / "ep2"
    moe = ["--model.num_layers=2", "--model.num_experts=2", "--model.moe_router_topk=1"]
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *TINY,
        *moe,
        "--parallel.expert_parallel=2",
    ]
    proc = run_process(cmd, env=ENV, timeout=400, cwd=tmp_path)
    assert (
        "launching 2 processes (DP2 x EP2; expert-parallel ranks are data-parallel" in proc.stdout
    )
    _check_run(run_dir, proc, "TP1 x PP1 x DP2 (EP2)", moe)


@pytest.mark.slow
def test_epochal_train_under_an_outer_torchrun_with_a_middle_stage(tmp_path):
    # three pipeline stages: the middle rank reads no data, only advances its position
    run_dir = tmp_path / "pp3"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=3",
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *TINY,
        "--parallel.pipeline_parallel=3",
        "--parallel.pipeline_schedule=1f1b",
    ]
    proc = run_process(cmd, env=ENV, timeout=400, cwd=tmp_path)
    assert "launching" not in proc.stdout
    _check_run(run_dir, proc, "TP1 x PP3 x DP1", [])
