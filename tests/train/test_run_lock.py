"""One training job per run directory (issue 26, lost data (c)): the run lock and unique temporary names."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from epochal.cli import main as cli_main
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.run_lock import (
    LOCK_NAME,
    RunDirLocked,
    RunLock,
    stale_temporary,
    temporary_token,
)
from tests.dist_utils import kill_tree, start_process
from tests.train.test_run_dir import TINY

HOLD = (
    "import sys, time\n"
    "from epochal.train.state.run_lock import RunLock\n"
    "with RunLock(sys.argv[1]):\n"
    "    print('held', flush=True)\n"
    "    time.sleep(120)\n"
)


def _holder(run_dir):
    """A process that holds ``run_dir``'s lock (until killed)."""
    proc = start_process([sys.executable, "-c", HOLD, str(run_dir)], stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_holder_is_refused_naming_the_run_dir_and_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RunDirLocked) as err:
            RunLock(run).acquire()
        msg = str(err.value)
        assert str(run) in msg and f"pid {holder.pid}" in msg and socket.gethostname() in msg
    finally:
        kill_tree(holder)
    # kill -9 of the holder frees the lock (the kernel drops it); its record is reported as stale
    notes = []
    with RunLock(run, log=notes.append) as lock:
        assert lock.held
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert notes and f"pid {holder.pid}" in notes[0] and "no longer runs" in notes[0]
    assert not (run / LOCK_NAME).exists()  # released: removed


def test_stale_record_without_flock_is_taken_over_and_a_live_one_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(
        RunLock, "_flock", staticmethod(lambda fd: None)
    )  # a file system without locks
    run = tmp_path / "run"
    run.mkdir()
    record = {"pid": _dead_pid(), "host": socket.gethostname(), "started": time.time()}
    (run / LOCK_NAME).write_text(json.dumps(record))
    notes = []
    with RunLock(run, log=notes.append):
        assert "no longer runs" in notes[0]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record["pid"] = holder.pid
        (run / LOCK_NAME).write_text(json.dumps(record))
        with pytest.raises(RunDirLocked, match=f"pid {holder.pid}"):
            RunLock(run).acquire()
        record["host"] = "some-other-host"
        (run / LOCK_NAME).write_text(json.dumps(record))
        with pytest.raises(RunDirLocked, match="cannot be checked"):
            RunLock(run).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_epochal_train_refuses_a_run_dir_in_use(tmp_path, capsys):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        assert cli_main(["train", f"--run_dir={run}", *TINY]) == 1
        err = capsys.readouterr().err
        assert f"run directory {run} is in use" in err and f"pid {holder.pid}" in err
        assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()
    finally:
        kill_tree(holder)
    assert cli_main(["train", f"--run_dir={run}", *TINY]) == 0  # free again
    assert (run / "checkpoints" / "latest").is_file() and not (run / LOCK_NAME).exists()


def test_trainer_takes_the_lock_while_it_trains(tmp_path):
    """The library path too: Trainer.train() holds the lock; a second trainer is refused."""
    from epochal.train.config import build_config
    from epochal.train.trainer import Trainer

    run = tmp_path / "run"
    config = build_config(preset="tiny", overrides=[f"--run_dir={run}", *TINY])
    seen = []
    trainer = Trainer(config, log=False)
    trainer.add_callback(lambda t, step, rec: seen.append((run / LOCK_NAME).is_file()))
    holder = _holder(run)
    try:
        with pytest.raises(RunDirLocked, match=str(run)):
            trainer.train()
        assert not (run / "metrics.jsonl").exists()
    finally:
        kill_tree(holder)
    trainer.train()
    assert seen == [True, True] and not (run / LOCK_NAME).exists()


def test_temporary_checkpoint_names_are_unique_per_process(tmp_path):
    import torch

    ck_dir = tmp_path / "ck"
    ck_dir.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # another job's save in progress (a live process on this host) must survive our save;
        # one of a dead process, and an unnamed one from an older release, are removed
        token = temporary_token()
        other = ck_dir / f".tmp-step_0000001.{token.replace(str(os.getpid()), str(live.pid))}"
        dead = ck_dir / f".tmp-step_0000001.{token.replace(str(os.getpid()), str(_dead_pid()))}"
        legacy = ck_dir / ".tmp-step_0000001"
        for d in (other, dead, legacy):
            d.mkdir()
        assert not stale_temporary(other.name) and stale_temporary(dead.name)
        ck = Checkpointer(ck_dir)
        ck.save(1, {"w": torch.ones(2)}, trainer_state={"step": 1}, rng_state={})
        assert other.is_dir() and not dead.exists() and not legacy.exists()
        assert (ck_dir / "step_0000001").is_dir()
        assert Checkpointer(ck_dir)._job_token() != ck._job_token()  # per Checkpointer and process
        assert f".{os.getpid()}." in ck._job_token()
    finally:
        live.kill()
        live.wait()
