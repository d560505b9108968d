"""No test leaves a process behind: interrupt a pytest run (Ctrl-C, SIGTERM) or time out a launch.

The target tests (``interrupt_target.py``) start workers that ignore SIGINT and
SIGTERM; after the interruption every one of them must be gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import dist_utils
from tests.cleanup import sleepy_worker
from tests.dist_utils import kill_tree, run_torchrun, start_process

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parents[2]
TARGET = Path(__file__).with_name("interrupt_target.py")
SLEEPER = "import time; print('ready', flush=True); time.sleep(120)"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_for_pids(folder: Path, count: int, proc: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + 240
    while len(pids := list(folder.glob("*.pid"))) < count:
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "the workers never started"
        time.sleep(0.1)
    return [int(p.read_text()) for p in pids]


def _survivors(pids: list[int]) -> list[int]:
    """The workers still alive after waiting up to a minute for them to go."""
    deadline = time.monotonic() + 60
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize(
    ("how", "target"),
    # spawned gloo ranks with SIGTERM, which reaches pytest alone (Ctrl-C also signals the
    # ranks themselves, the easier case); the slow tier signals torchrun's workers both
    # ways (the default tier's timed-out torchrun below goes through the same clean-up)
    [
        pytest.param("ctrl_c", "test_torchrun_workers", marks=pytest.mark.slow),
        pytest.param("sigterm", "test_torchrun_workers", marks=pytest.mark.slow),
        # the default tier's timed-out torchrun (below) goes through the same clean-up
        pytest.param("sigterm", "test_gloo_ranks", marks=pytest.mark.slow),
    ],
)
def test_interrupted_pytest_leaves_no_worker_behind(tmp_path, target, how):
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"{TARGET}::{target}",
    ]
    env = {**os.environ, "EPOCHAL_CLEANUP_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = start_process(cmd, env=env, cwd=REPO)
    pids: list[int] = []
    try:
        pids = _wait_for_pids(tmp_path, 2, proc)
        if how == "ctrl_c":  # a terminal sends SIGINT to the whole foreground process group
            os.killpg(proc.pid, signal.SIGINT)
        else:  # a scheduler or `kill` signals pytest alone
            os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        left = _survivors(pids)
        assert not left, f"workers {left} survived the interrupted pytest run:\n{out[-3000:]}"
    finally:
        for pid in pids:  # never leave them to the next test, whatever happened
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        kill_tree(proc)


def test_a_timed_out_torchrun_leaves_no_worker_behind(tmp_path):
    worker = str(Path(sleepy_worker.__file__))
    with pytest.raises(subprocess.TimeoutExpired):
        run_torchrun([worker, str(tmp_path)], 2, timeout=10, cwd=str(REPO))
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    try:
        assert len(pids) == 2, "the workers did not start within the timeout; raise it"
        assert not _survivors(pids)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _ignored(pid: int) -> int:
    """The process's mask of ignored signals (``SigIgn`` in ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_a_started_command_gets_ctrl_c_even_when_pytest_ignores_it():
    """``pytest &`` from a script ignores SIGINT and SIGQUIT, and ``exec`` keeps that.

    The interrupted-pytest test above then waited forever on a child that ignored
    its Ctrl-C (so it failed in suites started that way, and passed when run alone).
    """
    shell_ignores = (signal.SIGINT, signal.SIGQUIT)
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in shell_ignores}
    try:
        proc = start_process([sys.executable, "-I", "-c", SLEEPER])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert not [s.name for s in shell_ignores if _ignored(proc.pid) >> (s - 1) & 1]
        os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the started command ignored Ctrl-C (SIGINT)")
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in out
    finally:
        kill_tree(proc)


def test_a_second_ctrl_c_during_cleanup_leaves_the_command_to_the_exit_hook(monkeypatch):
    proc = start_process([sys.executable, "-I", "-c", SLEEPER])
    try:
        assert proc.stdout.readline() == "ready\n"

        def second_ctrl_c(*args: object) -> None:
            raise KeyboardInterrupt

        with monkeypatch.context() as m:
            m.setattr(os, "killpg", second_ctrl_c)
            with pytest.raises(KeyboardInterrupt):
                kill_tree(proc)
        assert proc.poll() is None
        assert proc.pid in dist_utils._LIVE  # so the atexit hook still kills it
    finally:
        kill_tree(proc)
    assert proc.poll() is not None and proc.pid not in dist_utils._LIVE
