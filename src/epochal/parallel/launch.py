"""Process launch and the default process group: ``epochal train`` under ``torchrun`` or by itself.

- Under a launcher (``torchrun``, ``torch.distributed.run``, a multi-node
  scheduler that sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``),
  the program runs unchanged: :func:`init_distributed` joins the process group.
- Not under a launcher, when the configuration asks for more than one process
  (``parallel.tensor_parallel * pipeline_parallel * data_parallel`` or
  ``parallel.nproc_per_node``), :func:`relaunch` starts
  ``python -m torch.distributed.run --standalone --nproc-per-node N -m epochal.cli
  <the same arguments>`` on this machine and returns its exit status.

Logs: only global rank 0 prints (:func:`is_logging_rank`); the other ranks run
silently unless they fail (their tracebacks reach ``torchrun``'s output).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from epochal.parallel.config import ParallelConfig

__all__ = [
    "DistributedInfo",
    "init_distributed",
    "is_logging_rank",
    "needs_relaunch",
    "rank0_first",
    "relaunch",
    "under_launcher",
]

_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_GUARD = "EPOCHAL_RELAUNCHED"
T = TypeVar("T")


def under_launcher() -> bool:
    """True if ``torchrun`` (or an equivalent launcher) started this process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE"))


def needs_relaunch(config: ParallelConfig) -> bool:
    """True if the configuration asks for several processes and no launcher started us."""
    return not under_launcher() and not os.environ.get(_GUARD) and config.launch_world_size() > 1


def relaunch(config: ParallelConfig, argv: Sequence[str], *, module: str = "epochal.cli") -> int:
    """Run ``python -m torch.distributed.run --standalone ... -m module argv`` and wait for it.

    Args:
        config: the parallel section (gives the number of processes).
        argv: the arguments after ``python -m module`` (e.g. ``["train", "--config", "x.toml"]``).
        module: the module to run in every process.

    Returns:
        The exit status of ``torchrun`` (0 if every rank succeeded).
    """
    n = config.launch_world_size()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        "-m",
        module,
        *argv,
    ]
    env = {**os.environ, _GUARD: "1"}
    if "OMP_NUM_THREADS" not in env and not torch.cuda.is_available():
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    print(f"epochal: launching {n} processes: {' '.join(cmd)}", flush=True)
    return subprocess.call(cmd, env=env)


class DistributedInfo:
    """Where this process sits: ``rank``, ``world_size``, ``local_rank`` and its ``device``."""

    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device) -> None:
        self.rank, self.world_size, self.local_rank, self.device = (
            rank,
            world_size,
            local_rank,
            device,
        )

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    def __repr__(self) -> str:
        return (
            f"DistributedInfo(rank={self.rank}, world_size={self.world_size}, device={self.device})"
        )


def init_distributed(config: ParallelConfig, device_name: str = "auto") -> DistributedInfo:
    """Join (or create) the default process group if this is a multi-process run.

    Args:
        config: the parallel section (``backend``).
        device_name: ``auto``, ``cpu`` or ``cuda`` (``training.device``); with
            CUDA each process uses GPU ``LOCAL_RANK``.

    Returns:
        This process's :class:`DistributedInfo` (rank 0 of 1 without a launcher).

    Raises:
        ValueError: CUDA asked for but absent, or more processes than GPUs on a node.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ValueError("training.device is 'cuda' but no CUDA device is available")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK {local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                "launch at most one process per GPU"
            )
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = config.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistributedInfo(rank, world, local_rank, device)


def is_logging_rank() -> bool:
    """True on the process that prints (global rank 0, or the only process)."""
    return not dist.is_initialized() or dist.get_rank() == 0


def rank0_first(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0, then (after a barrier) on the other ranks; return its result.

    For work that fills a shared cache (tokenizing a corpus, building index
    files): rank 0 writes it once, the others then find it.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return fn()
    if dist.get_rank() == 0:
        try:
            result = fn()
        finally:
            dist.barrier()
        return result
    dist.barrier()
    return fn()
