"""One training process per run directory: ``<run_dir>/.epochal-lock``.

Two ``epochal train`` in one run directory (started seconds apart, or a rerun
while an earlier job's workers still train) would interleave checkpoints and
log every step twice. So the process that trains in a run directory (rank 0
under ``torchrun``) holds an exclusive lock on ``<run_dir>/.epochal-lock`` while
it trains; a second one gets :class:`RunDirLocked` naming the directory and the
holder (pid, host, start time).

Mechanism: ``fcntl.flock`` on the open file (the kernel drops it when the
holder exits, ``kill -9`` included, so a lock left by a dead process is free and
is taken over, with a note naming the dead holder). The holder's pid, host and
start time are written into the file for the message. On a file system without
``flock`` support (``ENOLCK``/``EOPNOTSUPP``, some network mounts) the file's own
record decides: a holder on this host whose process is gone is stale and taken
over; a live one, or one on another host (which cannot be checked from here),
is refused, and the message says which file to delete if that job is known to
be dead. The file is removed when the lock is released.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from epochal.parallel.watchdog import pid_alive

__all__ = [
    "LOCK_NAME",
    "RunDirLocked",
    "RunLock",
    "check_run_dir_free",
    "hold_run_dir",
    "stale_temporary",
    "temporary_token",
]

LOCK_NAME = ".epochal-lock"

try:  # POSIX only; elsewhere the record in the file decides
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


class RunDirLocked(OSError):
    """Another live process trains in this run directory."""


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process whose record is unreadable"
    started = holder.get("started")
    when = (
        time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, (int, float))
        else ""
    )
    return f"pid {holder.get('pid')} on host {holder.get('host')}{when}"


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def temporary_token() -> str:
    """``<host>.<pid>.<random>``: a suffix for temporary names that no other process uses."""
    return f"{_host()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def stale_temporary(name: str) -> bool:
    """Whether the temporary ``name`` (ending in a :func:`temporary_token`) belongs to no live process.

    A name without a token (an older release's) is stale; one of another host is
    not (it cannot be checked from here).
    """
    m = re.search(r"\.([A-Za-z0-9_-]+)\.(\d+)\.[0-9a-f]{8}$", name)
    if m is None:
        return True
    return m.group(1) == _host() and not pid_alive(int(m.group(2)))


class RunLock:
    """The exclusive lock of one run directory (a context manager).

    Args:
        run_dir: the run directory (created if missing).
        log: where notes go (a stale lock taken over); default: stderr.

    Raises:
        RunDirLocked: (from :meth:`acquire`) another live process holds it; the
            message names the run directory, the holder's pid and host.
    """

    def __init__(self, run_dir: str | os.PathLike, *, log: Any = None) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def _record(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
            "argv": sys.argv,
        }

    def _read(self, fd: int | None = None) -> dict[str, Any]:
        try:
            if fd is not None:
                data = os.pread(fd, 1 << 16, 0)
            else:
                data = self.path.read_bytes()[: 1 << 16]
            holder = json.loads(data.decode("utf-8"))
            return holder if isinstance(holder, dict) else {}
        except (OSError, ValueError):
            return {}

    def _refuse(self, holder: dict[str, Any], extra: str = "") -> RunDirLocked:
        return RunDirLocked(
            errno.EBUSY,
            f"run directory {self.run_dir} is in use: {_describe(holder)} trains in it "
            f"(lock {self.path}){extra}; wait for it to finish, stop it, or use another run_dir",
        )

    def acquire(self) -> RunLock:
        """Take the lock or raise :class:`RunDirLocked` (see the module docstring)."""
        if self._fd is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # the file may be removed between open and lock: retry
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = self._flock(fd)
            except BaseException:
                os.close(fd)
                raise
            if locked is False:
                holder = self._read(fd)
                os.close(fd)
                raise self._refuse(holder)
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and removed by its holder meanwhile
                os.close(fd)
                continue
            previous = self._read(fd)
            if locked is None:  # no flock here: the record decides
                self._check_record(previous, fd)
            if previous.get("pid") is not None:
                self._log(
                    f"note: {self.path}: taking over the lock of {_describe(previous)}, "
                    "which no longer runs"
                )
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(self._record()).encode(), 0)
            os.fsync(fd)
            self._fd = fd
            return self
        raise self._refuse(self._read())

    @staticmethod
    def _flock(fd: int) -> bool | None:
        """True: locked; False: held by another process; None: no ``flock`` on this file system."""
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return None
            raise
        return True

    def _check_record(self, holder: dict[str, Any], fd: int) -> None:
        pid, host = holder.get("pid"), holder.get("host")
        if not isinstance(pid, int) or pid == os.getpid():
            return
        if host == socket.gethostname() and not pid_alive(pid):
            return  # stale: taken over by the caller
        os.close(fd)
        extra = (
            ""
            if host == socket.gethostname()
            else f"; this file system has no locks, so another host's job cannot be checked: "
            f"delete {self.path} if that job is dead"
        )
        raise self._refuse(holder, extra)

    def release(self) -> None:
        """Remove the lock file and release the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def check_run_dir_free(run_dir: str | os.PathLike) -> None:
    """Raise :class:`RunDirLocked` if a live process holds ``run_dir``'s lock (takes and releases it).

    A quick check before data and processes are prepared; the trainer takes the
    lock for real when it starts training.
    """
    if not (Path(run_dir) / LOCK_NAME).exists():
        return
    with RunLock(run_dir, log=lambda msg: None):
        pass


@contextlib.contextmanager
def hold_run_dir(
    run_dir: str | os.PathLike, *, rank: int = 0, any_rank: Any = None, log: bool = True
):
    """Hold ``run_dir``'s lock on rank 0 while the block runs; every rank raises if it is taken.

    Args:
        run_dir: the run directory.
        rank: this process's global rank (only rank 0 takes the lock).
        any_rank: ``f(int) -> int``, the maximum over all ranks (a collective every
            rank calls, so that all ranks raise together); None in one process.
        log: print the note about a stale lock taken over.

    Raises:
        RunDirLocked: another live process holds the lock (on rank 0: naming it;
            on the other ranks: saying that rank 0 could not take it).
    """
    lock = RunLock(run_dir, log=None if log else (lambda msg: None))
    error: RunDirLocked | None = None
    if rank == 0:
        try:
            lock.acquire()
        except RunDirLocked as exc:
            error = exc
    failed = any_rank(1 if error else 0) if any_rank is not None else (1 if error else 0)
    if error is not None:
        raise error
    if failed:
        raise RunDirLocked(errno.EBUSY, f"run directory {run_dir} is in use (see rank 0's error)")
    try:
        yield lock
    finally:
        lock.release()
