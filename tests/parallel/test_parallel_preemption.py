"""Preemption under torchrun: SIGTERM mid-run, every rank stops after the same step, saves, exits 0.

Two processes (data parallel, dropout on). ``epochal train`` relaunching itself
is signalled as Kubernetes or a terminal would (the launcher only); under an outer
``torchrun`` only rank 1 is signalled, so rank 0 learns it through the per-step
all-reduce. Both runs then resume and must reproduce the uninterrupted losses bit
for bit: those of one process (in this one, with one thread as the ranks have), which
two layout-invariant data-parallel ranks train to the bit.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from epochal.cli import main as cli_main
from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import kill_tree, one_thread, run_process, start_process, tree_pids

pytestmark = pytest.mark.distributed

ITERS = 24
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
    "--data.seq_length=16",
    "--model.vocab_size=256",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--model.hidden_dropout=0.1",
    f"--training.train_iters={ITERS}",
    "--training.micro_batch_size=1",
    "--training.global_batch_size=4",
    "--training.eval_interval=0",
    "--training.eval_iters=0",
    "--scheduler.lr_warmup_iters=0",
    "--checkpoint.save_interval=0",
    "--checkpoint.keep_last=10",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def _self_launched(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *TINY,
        "--parallel.data_parallel=2",
    ]


def _under_torchrun(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *TINY,
    ]


def _losses(run_dir: Path) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    try:
        records = list(read_metrics(run_dir / "metrics.jsonl"))
    except (FileNotFoundError, ValueError):
        return out
    for r in records:
        if r["kind"] == "train":
            out.setdefault(r["segment"], {})[r["step"]] = r["loss"]
    return out


def _rank_pid(proc, rank: int) -> int | None:
    """The worker of global rank ``rank`` among ``proc``'s descendants."""
    for pid in tree_pids(proc):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"epochal.cli" in cmdline:
            return pid
    return None


def _sigterm_at_step_2(cmd: list[str], run_dir: Path, rank: int | None) -> tuple[int, str]:
    """Run ``cmd``; once step 2 is logged, SIGTERM the command itself (None) or one rank's worker."""
    proc = start_process(cmd, env=ENV)
    try:
        deadline = time.monotonic() + 300
        while max(_losses(run_dir).get(0, {0: 0})) < 2:
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "training never reached step 2"
            time.sleep(0.05)
        target = proc.pid if rank is None else _rank_pid(proc, rank)
        assert target is not None, "no worker of that rank"
        os.kill(target, signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        kill_tree(proc)
    return proc.returncode, out


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    """The losses of the run that never stops: one process, one thread."""
    run_dir = tmp_path_factory.mktemp("full")
    with one_thread():
        assert cli_main(["train", f"--run_dir={run_dir}", *TINY]) == 0
    losses = _losses(run_dir)[0]
    assert sorted(losses) == list(range(1, ITERS + 1))
    return losses


@pytest.mark.parametrize(
    # the slow tier: a multi-rank stop on SIGTERM (the default tier's kill -9 of the
    # launcher in test_orphans_and_stalls.py stops the ranks the same way)
    "how",
    [
        pytest.param("launcher", marks=pytest.mark.slow),
        pytest.param("rank1_under_torchrun", marks=pytest.mark.slow),
    ],
)
def test_sigterm_stops_every_rank_after_one_step_saves_exits_0_and_resumes_exactly(
    tmp_path, uninterrupted, how
):
    run_dir = tmp_path / "run"
    command = _self_launched if how == "launcher" else _under_torchrun
    rc, out = _sigterm_at_step_2(command(run_dir), run_dir, None if how == "launcher" else 1)
    assert rc == 0, out[-4000:]
    reached = max(_losses(run_dir)[0])
    assert 2 <= reached < ITERS, out[-4000:]
    ckpt = run_dir / "checkpoints" / f"step_{reached:07d}"
    signal_name = "SIGTERM" if how == "launcher" else "a signal on another rank"
    assert f"stopped early ({signal_name}) after step {reached} of {ITERS}" in out, out[-4000:]
    assert f"checkpoint saved to {ckpt}" in out
    assert sorted(p.name for p in ckpt.parent.glob("step_*")) == [ckpt.name]
    if how == "launcher":
        assert "all 2 processes stopped cleanly" in out
    resumed = run_process(command(run_dir), env=ENV, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    got = _losses(run_dir)
    assert sorted(got[1]) == list(range(reached + 1, ITERS + 1))
    assert {**got[0], **got[1]} == uninterrupted  # every step, bit for bit
