"""Helpers for multi-process tests on the gloo backend.

``run_gloo(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` in
``world_size`` spawned processes that share an initialized gloo process group
and returns the per-rank return values (which must be picklable). A failure in
any rank re-raises here with that rank's traceback.

``run_torchrun(argv, nproc)`` runs a command under ``torchrun --standalone``.

Cleanup (no test may leave a process behind, on success, failure, timeout,
Ctrl-C or SIGTERM to pytest): :func:`start_process` starts a command in a session
of its own with a marker in its environment that every descendant inherits;
:func:`kill_tree` SIGKILLs the command, its process group and every process
carrying the marker (``torchrun`` starts each worker in a session of its own, and
workers orphaned by a dead ``torchrun`` are no longer its children, so neither
the process group nor the parent link finds them all). Tests call
``kill_tree`` in a ``finally``; an ``atexit`` hook kills whatever is still alive,
and ``tests/conftest.py`` turns SIGTERM into ``KeyboardInterrupt`` so both run.
``run_gloo``'s spawned ranks are killed the same way. A started command gets
SIGINT (and SIGQUIT, SIGTERM, SIGHUP) back at its default even when pytest was
started with it ignored (``pytest &`` in a script), so a test's Ctrl-C reaches it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

_MARK = "EPOCHAL_TEST_TREE"
_LIVE: dict[int, str] = {}  # pid of a started command -> its marker


#: Signals a shell may hand a command ignored: a non-interactive shell starts ``cmd &``
#: with SIGINT and SIGQUIT ignored, ``nohup`` ignores SIGHUP. An ignored disposition
#: survives ``exec``, and Python keeps SIGINT ignored instead of raising KeyboardInterrupt.
_RESET_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP)


def _ignored_signals() -> list[signal.Signals]:
    """The :data:`_RESET_SIGNALS` this process ignores (as Python and, on Linux, the kernel say)."""
    mask = 0
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as f:
            mask = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
    return [
        sig
        for sig in _RESET_SIGNALS
        if signal.getsignal(sig) == signal.SIG_IGN or mask >> (sig - 1) & 1
    ]


def _default_signals(ignored: list[signal.Signals], then: Callable[[], Any] | None):
    """A ``preexec_fn`` that sets ``ignored`` back to their defaults in the child, then runs ``then``."""

    def preexec() -> None:
        for sig in ignored:
            signal.signal(sig, signal.SIG_DFL)
        if then is not None:
            then()

    return preexec


def start_process(cmd: Sequence[str], *, env: dict[str, str] | None = None, **kwargs: Any):
    """``subprocess.Popen(cmd)`` in a new session, tracked for :func:`kill_tree` (text output).

    stdout and stderr are captured together unless ``stdout``/``stderr`` are given.

    The command starts with SIGINT, SIGQUIT, SIGTERM and SIGHUP at their defaults,
    as from a terminal, even when this pytest was started with them ignored (a suite
    run as ``pytest &`` from a script, or by a tool that starts commands so, ignores
    SIGINT, and every child inherited that): a test that sends the command SIGINT
    means Ctrl-C, and an inherited ``SIG_IGN`` made such a test wait forever.
    """
    mark = uuid.uuid4().hex
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.STDOUT)
    kwargs.setdefault("text", True)
    if ignored := _ignored_signals():  # only then: a preexec_fn costs a full fork
        kwargs["preexec_fn"] = _default_signals(ignored, kwargs.get("preexec_fn"))
    proc = subprocess.Popen(
        list(cmd), env={**(env or os.environ), _MARK: mark}, start_new_session=True, **kwargs
    )
    _LIVE[proc.pid] = mark
    return proc


def _marked(mark: str) -> list[int]:
    """Ids of the processes whose environment carries ``mark`` (Linux ``/proc``; else none)."""
    needle = f"{_MARK}={mark}".encode()
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                try:
                    with open(f"/proc/{name}/environ", "rb") as f:
                        if needle in f.read().split(b"\0"):
                            found.append(int(name))
                except OSError:
                    continue
    return found


def tree_pids(proc: subprocess.Popen) -> list[int]:
    """The started command's process and every live process descended from it."""
    mark = _LIVE.get(proc.pid)
    pids = _marked(mark) if mark else []
    return sorted(set(pids) | ({proc.pid} if proc.poll() is None else set()))


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` (from :func:`start_process`), its process group and all its descendants.

    The command stays registered for the ``atexit`` hook until it is dead: a second
    Ctrl-C that interrupts this still leaves its tree to that hook.
    """
    mark = _LIVE.get(proc.pid)
    for _ in range(3):  # a dying parent may still be starting a child: look again
        victims = set(_marked(mark)) if mark else set()
        if proc.poll() is None:
            victims.add(proc.pid)
        if not victims:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=10)  # reap and close the pipes
    _LIVE.pop(proc.pid, None)


def run_process(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300, **kwargs: Any
) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(cmd, capture_output=True, text=True)``, killing the whole tree on any exit."""
    proc = start_process(cmd, env=env, stderr=subprocess.PIPE, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        kill_tree(proc)
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


@atexit.register
def _kill_leftovers() -> None:
    for pid, mark in list(_LIVE.items()):
        for victim in [pid, *_marked(mark)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)
    _LIVE.clear()


@contextlib.contextmanager
def one_thread():
    """Run the block with torch on one thread, as the ranks of the multi-process tests compute
    (kernels' bits depend on the thread count); the count is restored after it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: What the fork server imports once, so that each rank starts without importing torch.
_PRELOAD = ["torch", "torch.distributed", "epochal.parallel.engine", "epochal.train.trainer"]


def _gloo_context():
    """Ranks are forked from a server that imported torch and epochal once (``forkserver``).

    Spawning a fresh interpreter per rank re-imports torch and epochal each time, seconds
    of CPU per rank on a two-core machine. The server imports only (no threads, no
    kernels run), so a forked rank is as fresh as a spawned one; :func:`_worker` gives it
    the caller's current environment and working directory, as spawning would.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable,
    args: tuple,
    queue,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> None:
    import torch.distributed as dist

    if env is not None:  # the caller's environment now, not the fork server's
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        result = fn(rank, world_size, *args)
        queue.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo(
    fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return results by rank.

    ``fn`` must be importable (a module-level function). Raises ``RuntimeError``
    with the failing rank's traceback if any rank raises. The rendezvous port is one
    that was free a moment before; if another process took it meanwhile (the store
    cannot listen, before any rank ran ``fn``), the group starts again on another
    port, at most three times.
    """
    for attempt in range(3):
        try:
            return _run_gloo_once(fn, world_size, args, timeout)
        except RuntimeError as exc:
            taken = "EADDRINUSE" in str(exc) and "init_process_group" in str(exc)
            if not taken or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _run_gloo_once(
    fn: Callable[..., Any], world_size: int, args: tuple, timeout: float
) -> list[Any]:
    ctx = _gloo_context()
    queue = ctx.Queue()
    port = free_port()
    env, cwd = dict(os.environ), os.getcwd()
    procs = [
        ctx.Process(
            target=_worker, args=(r, world_size, port, fn, args, queue, env, cwd), daemon=False
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    finished = False
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank} failed:\n{value}")
                break
        finished = not errors
    finally:
        # every rank reported: let them exit; otherwise (a failure, a timeout,
        # Ctrl-C) kill them at once: a rank may wait forever on a dead peer
        for p in procs:
            p.join(timeout=60 if finished else 5)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def run_torchrun(
    argv: Sequence[str],
    nproc: int,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``python -m torch.distributed.run --standalone --nproc-per-node nproc argv...``.

    Raises ``AssertionError`` with the captured output if the command fails.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *argv,
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = run_process(cmd, timeout=timeout, env=full_env, cwd=cwd)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )
    return proc
