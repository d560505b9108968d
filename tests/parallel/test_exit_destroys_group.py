"""``init_distributed`` leaves an ``atexit`` handler that destroys the process group it made.

Without it gloo's worker threads can outlive the interpreter's finalization and
abort a finished rank (SIGABRT, "terminate called without an active exception").
One process: a gloo group of one over a ``FileStore`` stands in for torchrun's
``env://`` rendezvous (``init_process_group`` patched), and the handler is taken
from ``atexit.register`` instead of waiting for the interpreter to exit.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from epochal.parallel import launch
from epochal.parallel.config import ParallelConfig


def test_the_exit_handler_destroys_the_group_it_made(monkeypatch, tmp_path):
    handlers = []
    real_init = dist.init_process_group
    store = dist.FileStore(str(tmp_path / "store"), 1)

    def init_one(backend, **kwargs):
        real_init(backend, store=store, rank=0, world_size=1, timeout=kwargs.get("timeout"))

    monkeypatch.setattr(dist, "init_process_group", init_one)
    monkeypatch.setattr(launch.atexit, "register", handlers.append)
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # more than one process: the group is made
    assert not dist.is_initialized()
    try:
        launch.init_distributed(ParallelConfig(backend="gloo"), "cpu")
        assert dist.is_initialized() and len(handlers) == 1
        handlers[0]()
        assert not dist.is_initialized()
        handlers[0]()  # a program that destroyed the group itself: nothing left to do
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _name_this_thread(name: str) -> None:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write(name)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads Linux's /proc")
def test_the_exit_waits_until_gloo_workers_sleep(tmp_path):
    """The exit handler's wait holds while a gloo worker runs, and ends once it sleeps.

    A gloo worker frees a finished collective's tensors after waking the caller (it
    takes the GIL for that); the wait lets it do so before the interpreter finalizes.
    A Python thread named like gloo's workers stands in for a busy one.
    """
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        out = [torch.zeros(3)]
        dist.all_gather(out, torch.ones(3))
        assert launch.wait_for_idle_gloo_threads()  # the real workers sleep between works
        stop = threading.Event()

        def busy() -> None:
            _name_this_thread(launch.GLOO_WORKER_THREAD)
            while not stop.is_set():
                pass  # running, not sleeping

        worker = threading.Thread(target=busy, daemon=True)
        worker.start()
        try:
            time.sleep(0.05)
            assert not launch.wait_for_idle_gloo_threads(limit_s=0.3)
        finally:
            stop.set()
            worker.join()
        assert launch.wait_for_idle_gloo_threads()
    finally:
        dist.destroy_process_group()
