"""This process's resident memory from ``/proc/self/status`` (Linux), for the benchmarks' memory columns."""

from __future__ import annotations

__all__ = ["reset_peak", "rss_mib"]


def rss_mib(field: str) -> float:
    """``/proc/self/status``'s ``field`` (``VmRSS``: resident now, ``VmHWM``: its peak) in MiB.

    Raises:
        RuntimeError: the file has no such field.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Reset this process's ``VmHWM`` to its current resident set (Linux's ``clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as stream:
        stream.write("5")
