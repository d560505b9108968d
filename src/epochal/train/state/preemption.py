"""Stopping a run early and cleanly: signals, a wall-time budget, a step multiple (Megatron's exit options).

Megatron-LM's ``--exit-signal-handler``, ``--exit-duration-in-mins`` and
``--exit-interval``, as ``training.exit_signal_handler``,
``training.exit_duration_mins`` and ``training.exit_interval``:

- **Signals.** While :meth:`Preemption.installed` is active, SIGTERM and SIGINT (what
  Slurm, Kubernetes and Ctrl-C send) only set a flag; the trainer finishes the step
  it is in, saves a checkpoint and returns normally, so the process exits 0.
  Repeated signals change nothing (Slurm signals every process of a job, and
  ``torchrun``'s agent forwards the same signal again); SIGKILL still kills.
- **Wall time.** After ``exit_duration_mins`` minutes since the trainer was created.
- **Step multiple.** After a step that is a multiple of ``exit_interval``.

Under ``torch.distributed`` the ranks agree: each step every rank contributes its
flag to one all-reduce (max) of a single integer, so all ranks stop after the same
step even if only one of them was signalled or its clock ran out first
(``exit_interval`` needs no agreement: the step count is the same everywhere).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["HANDLED_SIGNALS", "Preemption"]

HANDLED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)

# Reasons, by priority (the all-reduced code is the largest one that any rank has).
_REASONS = ("", "exit_interval", "exit_duration_mins", "signal")


class Preemption:
    """Decides, once per optimizer step, whether the run stops after that step.

    Args:
        exit_signal_handler: catch SIGTERM/SIGINT while :meth:`installed` is active.
        exit_duration_mins: stop after this many minutes of wall time since this
            object was created (None = no limit).
        exit_interval: stop after a step that is a multiple of this (None = never).
        any_rank: ``any_rank(code) -> max of code over all ranks`` (identity in one
            process); called once per step with a small int.
        clock: monotonic seconds (tests may pass another).
    """

    def __init__(
        self,
        *,
        exit_signal_handler: bool = True,
        exit_duration_mins: float | None = None,
        exit_interval: int | None = None,
        any_rank: Callable[[int], int] = lambda code: code,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.exit_signal_handler = exit_signal_handler
        self.exit_duration_mins = exit_duration_mins
        self.exit_interval = exit_interval
        self.any_rank = any_rank
        self.clock = clock
        self.started = clock()
        self.received: signal.Signals | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self.received is None:
            self.received = signal.Signals(signum)

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Catch :data:`HANDLED_SIGNALS` inside the block (no-op if disabled or off the main thread).

        The previous handlers are restored on exit.
        """
        if (
            not self.exit_signal_handler
            or threading.current_thread() is not threading.main_thread()
        ):
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _local_code(self, step: int) -> int:
        if self.received is not None:
            return _REASONS.index("signal")
        if (
            self.exit_duration_mins is not None
            and (self.clock() - self.started) / 60.0 > self.exit_duration_mins
        ):
            return _REASONS.index("exit_duration_mins")
        if self.exit_interval and step % self.exit_interval == 0:
            return _REASONS.index("exit_interval")
        return 0

    @property
    def needs_agreement(self) -> bool:
        """True if a rank may decide alone (a signal, a clock): then every step all-reduces."""
        return self.exit_signal_handler or self.exit_duration_mins is not None

    def should_stop(self, step: int) -> str | None:
        """Call after optimizer step ``step`` on every rank; the reason to stop there, or None.

        Returns:
            ``"signal"`` (with :attr:`received` naming it on the signalled ranks),
            ``"exit_duration_mins"`` or ``"exit_interval"``; the same on every rank.
        """
        code = self._local_code(step)
        if self.needs_agreement:
            code = int(self.any_rank(code))
        return _REASONS[code] or None

    def describe(self, reason: str) -> str:
        """A human sentence for ``reason`` (e.g. ``"SIGTERM"``, ``"training.exit_interval=5"``)."""
        if reason == "signal":
            return self.received.name if self.received is not None else "a signal on another rank"
        if reason == "exit_duration_mins":
            return f"training.exit_duration_mins={self.exit_duration_mins}"
        return f"training.exit_interval={self.exit_interval}"
