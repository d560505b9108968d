"""``get_logger``: Python logging that speaks on the main process only (Accelerate's API).

``logger.info(msg)`` logs on global rank 0 only; ``logger.info(msg,
main_process_only=False)`` on every process; ``in_order=True`` lets the processes
log one after the other (a barrier between them). The rank is ``torch.distributed``'s
when a process group exists, else ``$RANK`` (0 without a launcher).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch.distributed as dist

__all__ = ["MultiProcessAdapter", "get_logger"]


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger adapter with the ``main_process_only`` and ``in_order`` keywords."""

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at ``level`` on the main process (or every process, see the module docstring)."""
        main_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        kwargs.setdefault("stacklevel", 2)
        if not self.isEnabledFor(level):
            return
        rank, world = _rank_and_world()
        if main_only:
            if rank == 0:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            return
        if not in_order or world == 1 or not dist.is_initialized():
            msg, kwargs = self.process(msg, kwargs)
            self.logger.log(level, msg, *args, **kwargs)
            return
        for turn in range(world):
            if turn == rank:
                msg, kwargs = self.process(msg, kwargs)
                self.logger.log(level, msg, *args, **kwargs)
            dist.barrier()


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """The logger ``name`` wrapped for several processes.

    Args:
        name: the logger's name (usually ``__name__``).
        log_level: a level name (``"INFO"``); default ``$ACCELERATE_LOG_LEVEL`` if set.
    """
    logger = logging.getLogger(name)
    level = log_level or os.environ.get("ACCELERATE_LOG_LEVEL")
    if level is not None:
        logger.setLevel(level.upper())
        logger.root.setLevel(level.upper())
    return MultiProcessAdapter(logger, {})
