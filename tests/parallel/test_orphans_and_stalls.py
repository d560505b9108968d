"""No orphaned workers, no silent stall (issue 26).

``kill -9`` of the ``epochal train`` launcher or of ``torchrun``'s agent used to
leave both workers training to the end; a rank stopped with SIGSTOP was never
detected. Now the workers stop (as on a preemption: they finish the step and save)
when their parents die, and with ``parallel.timeout_minutes`` a survivor of a
stopped rank exits with an error naming itself within the timeout plus a margin.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from tests.dist_utils import kill_tree, start_process, tree_pids
from tests.parallel.test_parallel_preemption import ENV, _losses, _rank_pid, _self_launched

pytestmark = pytest.mark.distributed


def _launch(run_dir: Path, *extra: str, env: dict[str, str] | None = None):
    """``epochal train`` relaunching itself on 2 data-parallel ranks, for far more steps than run."""
    cmd = [
        "--training.train_iters=100000" if a.startswith("--training.train_iters") else a
        for a in _self_launched(run_dir)
    ]
    return start_process([*cmd, *extra], env={**ENV, **(env or {})})


def _wait_for_step(proc, run_dir: Path, step: int = 2) -> None:
    deadline = time.monotonic() + 300
    while max(_losses(run_dir).get(0, {0: 0})) < step:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "training never reached the step"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _running(p)]


def _workers(proc) -> list[int]:
    pids = [_rank_pid(proc, r) for r in (0, 1)]
    assert None not in pids
    return pids  # type: ignore[return-value]


def _agent(proc) -> int:
    for pid in tree_pids(proc):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"torch.distributed.run" in f.read():
                return pid
    raise AssertionError("no torchrun agent")


@pytest.mark.parametrize(
    "victim",
    # the default tier's stopped rank (above) goes through the same clean-up
    [
        pytest.param("launcher", marks=pytest.mark.slow),
        pytest.param("agent", marks=pytest.mark.slow),
    ],
)
def test_workers_stop_when_their_launcher_or_agent_is_killed(tmp_path, victim):
    run_dir = tmp_path / "run"
    proc = _launch(run_dir)
    try:
        _wait_for_step(proc, run_dir)
        workers, agent = _workers(proc), _agent(proc)
        os.kill(proc.pid if victim == "launcher" else agent, signal.SIGKILL)
        left = _wait_gone([*workers, agent], 120)
        assert not left, f"still running after kill -9 of the {victim}: {left}"
        # they stopped as on a preemption: a checkpoint of the step reached, the lock released
        reached = max(_losses(run_dir)[0])
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{reached:07d}"
        assert not (run_dir / ".epochal-lock").exists()
        if victim == "agent":  # the launcher survives and says what happened
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 128 + signal.SIGKILL, out[-3000:]
            assert "torchrun was killed by signal SIGKILL" in out, out[-3000:]
    finally:
        kill_tree(proc)


@pytest.mark.slow
def test_a_stopped_rank_ends_the_job_within_the_timeout(tmp_path):
    run_dir = tmp_path / "run"
    timeout_s = 3.0
    proc = _launch(
        run_dir,
        f"--parallel.timeout_minutes={timeout_s / 60}",
        env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"},
    )
    stopped = None
    try:
        _wait_for_step(proc, run_dir)
        survivor, stopped = _workers(proc)
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        assert not _wait_gone([survivor], timeout_s + 60), "the survivor never gave up"
        waited = time.monotonic() - t0
        # torchrun ends the stopped rank itself after its 30 s shutdown grace (SIGTERM
        # cannot reach a stopped process, then SIGKILL); do what it would, without the wait
        os.kill(stopped, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
        assert (
            "rank 0 of 2: a collective made no progress within parallel.timeout_minutes=0.05" in out
        ), out[-4000:]
        assert proc.returncode not in (0, None)
        assert "epochal: torchrun exited with status" in out, out[-4000:]
        assert waited >= timeout_s * 0.5
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        kill_tree(proc)
