"""No orphaned workers, no silent stall: workers stop when their launcher dies; stuck collectives end the job.

- **Parent death.** ``epochal train`` starts ``torchrun`` (its elastic agent),
  which starts the workers. Unwatched, ``kill -9`` of either parent would leave the
  workers training to the end (and a rerun would train alongside them). So:

  * the launcher starts ``torchrun`` with :func:`launcher_preexec`: on Linux the
    kernel sends the agent SIGTERM when the launcher dies
    (``prctl(PR_SET_PDEATHSIG)``), and the agent stops its workers as on any
    SIGTERM;
  * every worker calls :func:`watch_parent` (from
    :func:`~epochal.parallel.launch.init_distributed`): on Linux the kernel sends
    it SIGTERM when its own parent (the agent) dies, and a daemon thread polls
    every :data:`POLL_S` seconds whether its parent changed (it was re-parented)
    or the launcher named by ``EPOCHAL_LAUNCHER_PID`` is gone, for systems
    without ``prctl`` and for a launcher killed while the agent survives.

  SIGTERM is what Slurm and Kubernetes send, so a worker stops as on a
  preemption (:mod:`epochal.train.state.preemption`): it finishes the step, saves
  a checkpoint and exits (before training starts, SIGTERM ends it at once). A
  worker still alive :data:`GRACE_S` seconds after its parent died (stuck in a
  collective whose peers are gone) exits with status 1.

- **Stuck collectives.** ``parallel.timeout_minutes`` is the process group's
  timeout (torch's ``init_process_group(timeout=...)``; gloo and NCCL honour it):
  a collective that makes no progress for that long raises on the ranks waiting
  in it, and :func:`describe_collective_timeout` turns that error into one line
  naming the rank, the world size and the option.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time

from epochal._env import env_int

__all__ = [
    "GRACE_S",
    "LAUNCHER_PID_ENV",
    "POLL_S",
    "describe_collective_timeout",
    "exit_with_parent",
    "launcher_preexec",
    "pid_alive",
    "watch_parent",
]

LAUNCHER_PID_ENV = "EPOCHAL_LAUNCHER_PID"
POLL_S = 1.0
GRACE_S = 300.0
_PR_SET_PDEATHSIG = 1
_watching: list[threading.Thread] = []  # at most one watcher thread per process


def exit_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only).

    Returns:
        True if set (Linux ``prctl(PR_SET_PDEATHSIG)``), False elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def launcher_preexec() -> object:
    """A ``subprocess.Popen(preexec_fn=...)`` for the child the launcher starts (``torchrun``).

    In the child: SIGTERM when the launcher dies; exit at once if it already has.
    """
    launcher = os.getpid()

    def preexec() -> None:
        exit_with_parent(signal.SIGTERM)
        if os.getppid() != launcher:  # died between fork and prctl
            os._exit(1)

    return preexec


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this host; one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _launcher_pid() -> int | None:
    pid = env_int(LAUNCHER_PID_ENV, 0, minimum=0, maximum=2**31 - 1, unit="process id")
    return pid if pid > 1 and pid != os.getpid() else None


def watch_parent(
    *, poll_s: float = POLL_S, grace_s: float = GRACE_S, label: str = "worker"
) -> threading.Thread | None:
    """Stop this process when its parent or its launcher dies (see the module docstring).

    Sets ``PR_SET_PDEATHSIG`` (Linux) and starts one daemon thread per process
    (later calls return the running one). Returns the thread, or None when this
    process's parent is already init (nothing to watch).
    """
    if _watching:
        return _watching[0]
    parent = os.getppid()
    exit_with_parent(signal.SIGTERM)
    if parent <= 1:
        return None
    launcher = _launcher_pid()

    def gone() -> str | None:
        if os.getppid() != parent:
            return f"its parent process {parent} exited"
        if launcher is not None and not pid_alive(launcher):
            return f"its launcher (epochal train, pid {launcher}) exited"
        return None

    def watch() -> None:
        while True:
            why = gone()
            if why is not None:
                break
            time.sleep(poll_s)
        print(f"epochal: {label} {os.getpid()}: {why}; stopping", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        print(
            f"epochal: {label} {os.getpid()}: still running {grace_s:.0f} s after that; exiting",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)

    thread = threading.Thread(target=watch, name="epochal-parent-watch", daemon=True)
    thread.start()
    _watching.append(thread)
    return thread


def describe_collective_timeout(exc: BaseException, *, timeout_minutes: float | None) -> str | None:
    """One line for a collective that timed out (``exc`` from gloo/NCCL), or None for other errors.

    Names this rank (the process group must still be initialized), the world
    size and ``parallel.timeout_minutes``.
    """
    text = str(exc)
    if not isinstance(exc, RuntimeError) or not any(
        s in text.lower() for s in ("timed out", "timeout", "watchdog caught")
    ):
        return None
    import torch.distributed as dist

    where = "this rank"
    with contextlib.suppress(RuntimeError, ValueError):
        if dist.is_initialized():
            where = f"rank {dist.get_rank()} of {dist.get_world_size()}"
    limit = (
        f"parallel.timeout_minutes={timeout_minutes:g}"
        if timeout_minutes is not None
        else "torch's default process-group timeout (set parallel.timeout_minutes)"
    )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return (
        f"{where}: a collective made no progress within {limit}: another rank stopped, hung "
        f"or died ({first})"
    )
