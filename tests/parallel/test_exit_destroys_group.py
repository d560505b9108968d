"""``init_distributed`` leaves an ``atexit`` handler that destroys the process group it made.

Without it gloo's worker threads can outlive the interpreter's finalization and
abort a finished rank (SIGABRT, "terminate called without an active exception").
One process: a gloo group of one over a ``FileStore`` stands in for torchrun's
``env://`` rendezvous (``init_process_group`` patched), and the handler is taken
from ``atexit.register`` instead of waiting for the interpreter to exit.
"""

from __future__ import annotations

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
