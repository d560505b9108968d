"""Preemption: SIGTERM/SIGINT and the exit options stop after a step, save, and resume bit-exactly."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.inputs.loaders import make_loaders
from epochal.train.observe.metrics import read_metrics
from epochal.train.state.preemption import Preemption
from epochal.train.trainer import Trainer
from tests.dist_utils import kill_tree, start_process
from tests.train.synthetic import CountingDataset

VOCAB = 64
ITERS = 8
BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    "--data.seq_length=8",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.ffn_hidden_size=64",
    "--model.hidden_dropout=0.1",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    f"--training.train_iters={ITERS}",
    "--training.eval_interval=0",
    "--training.eval_iters=0",
    "--scheduler.lr_warmup_iters=1",
    "--checkpoint.save_interval=0",
    "--checkpoint.keep_last=10",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def trainer(run_dir: Path, *extra: str) -> Trainer:
    cfg = build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *BASE, *extra])
    data = make_loaders(cfg, CountingDataset(1000, 8, VOCAB), None, vocab_size=VOCAB)
    return Trainer(cfg, data=data, log=False)


def steps(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[float]:
    return trainer(tmp_path_factory.mktemp("full")).train().losses


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_after_the_step_saves_and_resumes_bit_exactly(tmp_path, uninterrupted, sig):
    tr = trainer(tmp_path)
    tr.add_callback(lambda t, step, m: os.kill(os.getpid(), sig) if step == 3 else None)
    before = signal.getsignal(sig)
    result = tr.train()
    assert signal.getsignal(sig) is before  # the handler is only active inside train()
    assert (result.final_step, result.stopped_by) == (3, sig.name)
    assert steps(tmp_path) == ["step_0000003"] and result.last_checkpoint.name == "step_0000003"
    assert result.losses == uninterrupted[:3]
    resumed = trainer(tmp_path).train()
    assert resumed.start_step == 3 and resumed.stopped_by is None
    assert resumed.losses == uninterrupted[3:]  # bit for bit (dropout on)


def test_exit_interval_stops_at_a_step_multiple_and_a_rerun_goes_on(tmp_path, uninterrupted):
    first = trainer(tmp_path, "--training.exit_interval=3").train()
    assert (first.final_step, first.stopped_by) == (3, "training.exit_interval=3")
    second = trainer(tmp_path, "--training.exit_interval=3").train()
    assert (second.start_step, second.final_step) == (3, 6)
    third = trainer(tmp_path, "--training.exit_interval=3").train()
    assert (third.final_step, third.stopped_by) == (ITERS, None)  # the last step is a normal end
    assert first.losses + second.losses + third.losses == uninterrupted
    assert steps(tmp_path) == ["step_0000003", "step_0000006", f"step_{ITERS:07d}"]


def test_exit_duration_stops_once_the_wall_time_is_spent(tmp_path, uninterrupted):
    tr = trainer(tmp_path, "--training.exit_duration_mins=1e-9")
    result = tr.train()
    assert (result.final_step, result.stopped_by) == (1, "training.exit_duration_mins=1e-09")
    assert steps(tmp_path) == ["step_0000001"]
    assert trainer(tmp_path).train().losses == uninterrupted[1:]


def test_preemption_decision_and_agreement():
    clock = [0.0]
    p = Preemption(exit_duration_mins=2.0, exit_interval=5, clock=lambda: clock[0])
    assert [p.should_stop(s) for s in (1, 4, 5)] == [None, None, "exit_interval"]
    clock[0] = 121.0
    assert p.should_stop(6) == "exit_duration_mins"
    p._on_signal(signal.SIGTERM, None)
    p._on_signal(signal.SIGINT, None)  # a repeated signal changes nothing
    assert p.should_stop(7) == "signal" and p.describe("signal") == "SIGTERM"
    # another rank was signalled: the all-reduced code says so; this rank names no signal
    other = Preemption(any_rank=lambda code: max(code, 3))
    assert (
        other.should_stop(1) == "signal" and other.describe("signal") == "a signal on another rank"
    )
    off = Preemption(exit_signal_handler=False, any_rank=lambda code: 1 / 0)
    assert off.should_stop(1) is None  # nothing a rank decides alone: no all-reduce


def test_signal_handler_can_be_turned_off(tmp_path):
    tr = trainer(tmp_path, "--training.exit_signal_handler=false")
    seen = []
    with tr.preemption.installed():
        seen.append(signal.getsignal(signal.SIGTERM))
    assert seen == [signal.getsignal(signal.SIGTERM)]


@pytest.mark.parametrize(
    "override", ["--training.exit_interval=0", "--training.exit_duration_mins=0"]
)
def test_bad_exit_options_name_the_option(tmp_path, override):
    with pytest.raises(ConfigError, match=override.split("=")[0].removeprefix("--")):
        build_config(preset="tiny", overrides=[f"--run_dir={tmp_path}", override])


def _cli(run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "epochal.cli",
        "train",
        f"--run_dir={run_dir}",
        *[a for a in BASE if not a.startswith("--training.train_iters")],
        "--model.vocab_size=256",
        f"--training.train_iters={CLI_ITERS}",
    ]


CLI_ITERS = 50
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _records(run_dir: Path) -> list[dict]:
    try:
        return list(read_metrics(run_dir / "metrics.jsonl"))
    except (FileNotFoundError, ValueError):
        return []


def _losses(run_dir: Path) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for r in _records(run_dir):
        if r["kind"] == "train":
            out.setdefault(r["segment"], {})[r["step"]] = r["loss"]
    return out


def sigterm_mid_run(cmd: list[str], run_dir: Path, pid_to_signal=None) -> tuple[int, str]:
    """Start ``cmd``, SIGTERM it once metrics show step 2; return (rc, output)."""
    proc = start_process(cmd, env=ENV)
    try:
        deadline = time.monotonic() + 240
        while not any(r["kind"] == "train" and r["step"] >= 2 for r in _records(run_dir)):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "training never reached step 2"
            time.sleep(0.05)
        os.kill(pid_to_signal or proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        kill_tree(proc)
    return proc.returncode, out


def test_epochal_train_exits_0_after_sigterm_and_resumes_bit_exactly(tmp_path):
    """The CLI in a subprocess: SIGTERM from outside mid-run; rc 0; a rerun finishes with the same losses."""
    full, run_dir = tmp_path / "full", tmp_path / "run"
    uninterrupted = start_process(_cli(full), env=ENV)
    try:
        rc, out = sigterm_mid_run(_cli(run_dir), run_dir)
        full_out, _ = uninterrupted.communicate(timeout=300)
    finally:
        kill_tree(uninterrupted)
    assert uninterrupted.returncode == 0, full_out
    assert rc == 0, out
    reached = max(_losses(run_dir)[0])
    assert 2 <= reached < CLI_ITERS, out
    assert steps(run_dir) == [f"step_{reached:07d}"]
    ckpt = run_dir / "checkpoints" / f"step_{reached:07d}"
    assert (
        f"stopped early (SIGTERM) after step {reached} of {CLI_ITERS}; checkpoint saved to {ckpt}"
        in out
    )
    assert out.count(f"after step {reached}") == 1, out  # the stop is reported once
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == reached
    again = start_process(_cli(run_dir), env=ENV)
    try:
        out, _ = again.communicate(timeout=300)
    finally:
        kill_tree(again)
    assert again.returncode == 0, out
    expected, got = _losses(full)[0], _losses(run_dir)
    assert sorted(got[1]) == list(range(reached + 1, CLI_ITERS + 1))
    assert {**got[0], **got[1]} == expected  # every step, bit for bit
