"""Benchmark rows in child processes that never outlive the benchmark.

A benchmark that runs each row in a fresh process (so that peak memory is the row's
own) must not leave a row running when it is stopped: ``timeout`` sends the parent
SIGTERM, a job scheduler SIGKILL, a terminal SIGINT or SIGHUP. So:

- each child starts in its own process group (its helpers, e.g. ``torch.compile``'s
  worker pool, join it) and asks the kernel for SIGTERM when its parent dies
  (``prctl(PR_SET_PDEATHSIG)`` on Linux, :func:`epochal.parallel.watchdog.launcher_preexec`);
  that covers a SIGKILLed parent;
- :func:`install_cleanup` turns SIGTERM and SIGHUP into a normal exit, so the parent's
  ``finally`` blocks and ``atexit`` handler kill every live child's whole group;
- :func:`run_child` kills the group when the row ends, times out or is interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from types import FrameType

from epochal.parallel.watchdog import launcher_preexec

__all__ = ["install_cleanup", "kill_group", "run_child"]

_live: set[subprocess.Popen] = set()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s process group (the child and whatever it started); no error if gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_all() -> None:
    for proc in list(_live):
        kill_group(proc)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    del frame
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Make SIGTERM / SIGHUP exit normally and kill every live child's group at exit."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    atexit.register(_kill_all)


def run_child(cmd: Sequence[str], *, timeout: float) -> tuple[int | None, str, str]:
    """Run ``cmd`` in its own process group, tied to this process's life.

    Returns:
        ``(return code, stdout, stderr)``; the code is None when the child was killed
        after ``timeout`` seconds (stderr then says so).
    """
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=launcher_preexec(),  # noqa: PLW1509 - prctl only, no locks taken
    )
    _live.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        code, err = None, f"{err}\nkilled after {timeout:.0f} s (--row-timeout)"
    finally:
        kill_group(proc)  # a helper the row left behind, or this process stopping
        _live.discard(proc)
    return code, out, err
