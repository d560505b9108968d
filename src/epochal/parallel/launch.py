"""Process launch and the default process group: ``epochal train`` under ``torchrun`` or by itself.

- Under a launcher (``torchrun``, ``torch.distributed.run``, a multi-node
  scheduler that sets ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``),
  the program runs unchanged: :func:`init_distributed` joins the process group.
- Not under a launcher, when the configuration asks for more than one process
  (:meth:`~epochal.parallel.config.ParallelConfig.launch_world_size`:
  ``tensor_parallel * context_parallel * pipeline_parallel`` times ``data_parallel``,
  or ``expert_parallel`` when that is unset; or ``parallel.nproc_per_node``) and this
  machine runs them (:func:`local_process_limit`), :func:`relaunch` starts
  ``python -m torch.distributed.run --standalone --nproc-per-node N -m epochal.cli
  <the same arguments>`` on this machine and returns its exit status.

Preemption: :func:`relaunch` starts ``torchrun`` in a session of its own (so a
terminal's Ctrl-C reaches only this process) and forwards the first SIGTERM or
SIGINT to it; ``torchrun``'s elastic agent (torch 2.13) then sends that signal to
every worker's process group, waits up to ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
seconds (``--shutdown-timeout``; 30 by default, set to 600 here unless given)
before SIGKILL, and exits 1 with a ``SignalException`` even when every worker
stopped cleanly. So each worker that returns normally reports it
(:func:`report_clean_exit`, a file per rank in a folder named by
``EPOCHAL_EXIT_REPORT_DIR``), and :func:`relaunch` returns 0 after a signal when
every rank did.

Exit: :func:`init_distributed` registers an ``atexit`` handler that destroys the
default process group (and every group made from it) while the interpreter is
still whole, then waits until gloo's worker threads are idle
(:func:`wait_for_idle_gloo_threads`). A gloo worker frees a finished collective's
work after it has woken the caller; freeing its tensors takes the GIL, and a thread
that asks for the GIL once Python has begun to finalize is ended by the
interpreter, which aborts the whole process ("terminate called without an active
exception", SIGABRT) after the program itself has finished. A program that
destroyed its groups already is left alone, and its threads are waited for too.

Logs: only global rank 0 prints (:func:`is_logging_rank`); the other ranks run
silently unless they fail (their tracebacks reach ``torchrun``'s output).
"""

from __future__ import annotations

import atexit
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from epochal._text import plural
from epochal.model.config import ConfigError
from epochal.parallel.config import ParallelConfig
from epochal.parallel.process_limit import (
    OVERSUBSCRIBE,
    PROCESSES_PER_CPU,
    cpu_process_limit,
    usable_cpu_cores,
)
from epochal.parallel.watchdog import LAUNCHER_PID_ENV, launcher_preexec, watch_parent

__all__ = [
    "OVERSUBSCRIBE",
    "PROCESSES_PER_CPU",
    "DistributedInfo",
    "check_gloo_on_cuda",
    "check_launchable",
    "cpu_process_limit",
    "init_distributed",
    "local_process_limit",
    "is_logging_rank",
    "needs_relaunch",
    "rank0_first",
    "relaunch",
    "report_clean_exit",
    "under_launcher",
    "usable_cpu_cores",
]

_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_GUARD = "EPOCHAL_RELAUNCHED"
_REPORT_DIR = "EPOCHAL_EXIT_REPORT_DIR"
_SHUTDOWN_TIMEOUT = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
T = TypeVar("T")


def under_launcher() -> bool:
    """True if ``torchrun`` (or an equivalent launcher) started this process."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE"))


def needs_relaunch(config: ParallelConfig) -> bool:
    """True if the configuration asks for several processes and no launcher started us."""
    return not under_launcher() and not os.environ.get(_GUARD) and config.launch_world_size() > 1


def _one_process_per_gpu(device_name: str, backend: str) -> bool:
    """Whether each process drives a GPU of its own (CUDA with NCCL), which bounds them."""
    cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    return cuda and backend != "gloo"


def local_process_limit(
    device_name: str = "auto", backend: str = "auto", *, oversubscribe: bool = False
) -> tuple[int | None, str]:
    """How many training processes this machine runs: ``(limit or None for no bound, why)``.

    The bound ``epochal train`` (launching itself) and ``epochal launch`` share: one
    process per CUDA device with ``training.device`` ``cuda`` (or ``auto`` where CUDA
    exists) and NCCL, since each drives its own GPU; otherwise
    :data:`PROCESSES_PER_CPU` per CPU core this process may use (:func:`cpu_process_limit`),
    which ``oversubscribe`` lifts. With ``parallel.backend`` ``gloo`` ranks may share a
    GPU (rank ``r`` uses GPU ``r % count``), so the CPU bound applies there too.
    """
    if _one_process_per_gpu(device_name, backend):
        gpus = torch.cuda.device_count()
        return gpus, f"one per GPU, {plural(gpus, 'CUDA device')} visible"
    return cpu_process_limit(oversubscribe)


def check_launchable(
    processes: int,
    device_name: str = "auto",
    *,
    option: str,
    backend: str = "auto",
    oversubscribe: bool = False,
) -> None:
    """Refuse more processes on this machine than :func:`local_process_limit` allows.

    Raises:
        ConfigError: naming ``option``, the number asked for, the machine's bound and
            the ways past it (fewer processes, more nodes, ``--oversubscribe`` on a CPU).
    """
    limit, why = local_process_limit(device_name, backend, oversubscribe=oversubscribe)
    if limit is not None and processes > limit:
        shown = str(processes) if processes < 10**12 else f"about 10^{len(str(processes)) - 1}"
        gpus = _one_process_per_gpu(device_name, backend)
        raise ConfigError(
            option,
            f"asks for {shown} processes on this machine, but it runs at most {limit} ({why}; "
            f"training.device={device_name!r}); use fewer, or several nodes under torchrun"
            + ("" if gpus else f", or start them anyway with epochal train {OVERSUBSCRIBE}"),
        )


def relaunch(
    config: ParallelConfig,
    argv: Sequence[str],
    *,
    module: str = "epochal.cli",
    script: str | None = None,
    rendezvous: Sequence[str] = ("--standalone",),
) -> int:
    """Run ``python -m torch.distributed.run --standalone ... -m module argv`` and wait for it.

    Args:
        config: the parallel section (gives the number of processes per node).
        argv: the arguments after ``python -m module`` (e.g. ``["train", "--config", "x.toml"]``).
        module: the module to run in every process.
        script: run this Python file instead of ``module`` (``epochal launch``).
        rendezvous: torchrun's rendezvous options (several nodes: ``--nnodes``,
            ``--node-rank``, ``--master-addr``, ``--master-port``).

    Returns:
        The exit status of ``torchrun`` (0 if every rank succeeded); after a SIGTERM
        or SIGINT forwarded to it, 0 if every rank reported a clean exit (see the
        module docstring), else ``torchrun``'s status.
    """
    n = config.launch_world_size()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *rendezvous,
        f"--nproc-per-node={n}",
        *([script] if script is not None else ["-m", module]),
        *argv,
    ]
    env = {**os.environ, _GUARD: "1", LAUNCHER_PID_ENV: str(os.getpid())}
    if "OMP_NUM_THREADS" not in env and not torch.cuda.is_available():
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // n))
    env.setdefault(_SHUTDOWN_TIMEOUT, "600")
    print(
        f"epochal: launching {plural(n, 'process')}{_layout_note(config)}: {' '.join(cmd)}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="epochal-exit-") as reports:
        env[_REPORT_DIR] = reports
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=launcher_preexec())
        received: list[signal.Signals] = []

        def forward(signum: int, frame: object) -> None:  # noqa: ARG001
            if not received:  # torchrun's agent treats a second signal as a second shutdown
                received.append(signal.Signals(signum))
                proc.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            rc = proc.wait()
        except BaseException:
            proc.terminate()  # torchrun shuts its workers down; never leave them behind
            proc.wait()
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        done = len([p for p in os.listdir(reports) if p.startswith("rank")])
        if received and rc != 0:
            if done == n:
                print(
                    f"epochal: {received[0].name}: all {n} processes stopped cleanly "
                    f"(torchrun's exit status {rc} only reports the signal)",
                    flush=True,
                )
                return 0
            print(
                f"epochal: {received[0].name}: {done} of {plural(n, 'process')} stopped cleanly",
                flush=True,
            )
        return _report_status(rc, n, done)


def _layout_note(config: ParallelConfig) -> str:
    """`` (TP2 x DP2)``: the layout the processes form (none with ``nproc_per_node`` given).

    When the data-parallel size comes from ``expert_parallel`` alone it says so, and how
    to ask for more data-parallel ranks.
    """
    if config.nproc_per_node:
        return ""
    note = config.describe_launch()
    if config.data_parallel is None and config.expert_parallel > 1:
        note += (
            f"; expert-parallel ranks are data-parallel ranks, so parallel.expert_parallel="
            f"{config.expert_parallel} runs on {config.expert_parallel} data-parallel ranks "
            "(set parallel.data_parallel to a multiple of it for more)"
        )
    return f" ({note})"


def _report_status(rc: int, n: int, done: int) -> int:
    """Say how ``torchrun`` ended unless it succeeded; the launcher's exit status (128 + signal if killed)."""
    if rc == 0:
        return 0
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else -rc
        print(
            f"epochal: torchrun was killed by signal {name} (exit status {128 - rc}); "
            f"{done} of {plural(n, 'process')} had finished; its workers stop when it dies",
            file=sys.stderr,
            flush=True,
        )
        return 128 - rc
    print(
        f"epochal: torchrun exited with status {rc}: {n - done} of {plural(n, 'process')} failed or "
        "were stopped (the failing rank's error and torchrun's summary are above)",
        file=sys.stderr,
        flush=True,
    )
    return rc


def report_clean_exit() -> None:
    """Record that this rank returned normally, for :func:`relaunch` (no-op outside it)."""
    folder = os.environ.get(_REPORT_DIR)
    if folder and os.path.isdir(folder):
        rank = os.environ.get("RANK", "0")
        with open(os.path.join(folder, f"rank{rank}"), "w") as f:
            f.write("0\n")


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
        ValueError: CUDA asked for but absent, or more processes than GPUs on a node
            (except with ``parallel.backend = "gloo"``, where ranks share GPUs).
        ConfigError: gloo on CUDA with a layout it cannot run (:func:`check_gloo_on_cuda`).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda:
        if not torch.cuda.is_available():
            raise ValueError("training.device is 'cuda' but no CUDA device is available")
        gpus = torch.cuda.device_count()
        if config.backend == "gloo" and world > 1:
            check_gloo_on_cuda(config)
            index = local_rank % gpus  # ranks share GPUs: a debugging mode (module docstring)
        elif local_rank >= gpus:
            raise ValueError(
                f"LOCAL_RANK {local_rank} has no GPU ({gpus} visible); launch at most one "
                "process per GPU, or set parallel.backend='gloo' to let data-parallel ranks "
                "share GPUs for debugging"
            )
        else:
            index = local_rank
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    if under_launcher():  # stop when torchrun's agent or epochal's launcher dies
        watch_parent(label=f"rank {rank}")
    if world > 1 and not dist.is_initialized():
        backend = config.backend
        if backend == "auto":
            backend = "nccl" if use_cuda else "gloo"
        timeout = (
            None
            if config.timeout_minutes is None
            else datetime.timedelta(minutes=config.timeout_minutes)
        )
        dist.init_process_group(
            backend, device_id=device if backend == "nccl" else None, timeout=timeout
        )
        atexit.register(_destroy_process_group_at_exit)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistributedInfo(rank, world, local_rank, device)


def _destroy_process_group_at_exit() -> None:
    """Destroy the default process group if the program left it open, then let gloo's
    threads finish (module docstring)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    wait_for_idle_gloo_threads()


#: the name (``/proc/<pid>/task/<tid>/comm``) of gloo's collective worker threads
GLOO_WORKER_THREAD = "pt_gloo_runloop"


def wait_for_idle_gloo_threads(
    limit_s: float = 2.0, poll_s: float = 0.005, quiet_polls: int = 3
) -> bool:
    """Wait (at most ``limit_s`` seconds) until every gloo worker thread of this process sleeps.

    Each poll sleeps ``poll_s`` seconds, which releases the GIL, so a worker waiting
    for it to free a finished collective's tensors gets it; the threads count as idle
    once ``quiet_polls`` polls in a row found all of them sleeping (``S`` in
    ``/proc/self/task/*/stat``). Linux only; elsewhere it returns at once.

    Returns:
        True if the threads were idle (or there are none), False at the time limit.
    """
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return True
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < quiet_polls:
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
        quiet = quiet + 1 if _gloo_workers_sleep(tasks) else 0
    return True


def _gloo_workers_sleep(tasks: str) -> bool:
    """Whether every gloo worker thread listed under ``tasks`` is in the sleeping state."""
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/comm") as comm:
                if comm.read().strip() != GLOO_WORKER_THREAD:
                    continue
            with open(f"{tasks}/{tid}/stat") as stat:  # "pid (comm) state ..."
                state = stat.read().rpartition(")")[2].split()[0]
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
        if state != "S":
            return False
    return True


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


def check_gloo_on_cuda(config: ParallelConfig) -> None:
    """Refuse the layouts that the gloo backend cannot run on CUDA tensors.

    Gloo implements only broadcast and all-reduce (and barrier) for CUDA tensors
    (PyTorch's backend table: no all-gather, reduce-scatter or send/recv), so with
    ``parallel.backend = "gloo"`` and CUDA only plain data parallelism is allowed:
    replicated parameters (``dp_sharding = "none"``: gradients all-reduced), no tensor
    or pipeline parallelism, no sharded optimizer. It is a debugging mode (several ranks
    on one GPU, e.g. to check a data-parallel run on a one-GPU machine), not a fast one.
    Not yet run on a GPU: should the data-parallel
    wrapper issue a collective gloo lacks on CUDA, PyTorch's own error names it.

    Raises:
        ConfigError: names the first option gloo cannot serve on CUDA.
    """
    for option, value, allowed in (
        ("tensor_parallel", config.tensor_parallel, 1),
        ("pipeline_parallel", config.pipeline_parallel, 1),
        ("dp_sharding", config.dp_sharding, "none"),
    ):
        if value != allowed:
            raise ConfigError(
                f"parallel.{option}",
                f"is {value!r}, but parallel.backend='gloo' on CUDA runs only data parallelism "
                f"with replicated parameters (tensor_parallel=1, pipeline_parallel=1, "
                f"dp_sharding='none'); use NCCL (one process per GPU) or training.device='cpu'",
            )
