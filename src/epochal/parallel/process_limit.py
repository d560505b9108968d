"""How many CPU processes one machine starts: the bound ``epochal train`` and ``epochal launch`` share.

On a CPU each training process computes with its own threads, so a machine runs
:data:`PROCESSES_PER_CPU` processes per CPU core this process may use (its affinity
mask) and refuses more before any starts, naming the option that asked. Four per core
lets a small machine try a real layout (TP2 x DP2 on one core, PP2 x TP2 x DP2 on two),
slowly; past it the processes only queue for the cores. ``--oversubscribe`` (Open MPI's
name for the same choice, a flag of both commands) starts more anyway. On GPUs the
bound is one process per GPU (:func:`epochal.parallel.launch.local_process_limit`).

Imports no torch, so a command's ``--help`` stays fast.
"""

from __future__ import annotations

import os

from epochal._text import plural

__all__ = ["OVERSUBSCRIBE", "PROCESSES_PER_CPU", "cpu_process_limit", "usable_cpu_cores"]

#: CPU processes per usable core that ``epochal train`` (launching itself) and ``epochal
#: launch`` start on one machine without :data:`OVERSUBSCRIBE`
PROCESSES_PER_CPU = 4
#: the flag of both commands that starts more CPU processes anyway
OVERSUBSCRIBE = "--oversubscribe"


def usable_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def cpu_process_limit(oversubscribe: bool = False) -> tuple[int | None, str]:
    """The CPU processes one machine starts: ``(PROCESSES_PER_CPU * cores, why)``, or None.

    ``oversubscribe`` (the ``--oversubscribe`` flag of ``epochal train`` and ``epochal
    launch``) lifts the bound: ``(None, why)``.
    """
    if oversubscribe:
        return None, f"no bound with {OVERSUBSCRIBE}"
    cores = usable_cpu_cores()
    return PROCESSES_PER_CPU * cores, (
        f"{PROCESSES_PER_CPU} per CPU core, {plural(cores, 'CPU core')} usable"
    )
