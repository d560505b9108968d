"""A worker that ignores SIGINT and SIGTERM, writes its process id to ``DIR/<name>.pid`` and sleeps.

Usage: python sleepy_worker.py DIR   (a ``torchrun`` worker: the name is ``rank{RANK}``)

It stands for a worker stuck in a collective or busy saving: only SIGKILL ends it,
so a test that leaves it behind is caught.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def sleep_forever(folder: str, name: str) -> None:
    """Ignore SIGINT/SIGTERM, publish the pid as ``folder/name.pid``, sleep 10 minutes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tmp = Path(folder) / f".{name}.tmp"
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(folder) / f"{name}.pid")
    time.sleep(600)


def gloo_rank(rank: int, world_size: int, folder: str) -> None:
    """``run_gloo`` entry point."""
    sleep_forever(folder, f"gloo{rank}")


if __name__ == "__main__":
    sleep_forever(sys.argv[1], f"rank{os.environ.get('RANK', '0')}")
