"""``logging.profile_steps = [start, end]``: a ``torch.profiler`` trace of those steps only.

Steps are the optimizer steps as logged (1-based, inclusive). The profiler starts
before step ``start`` and stops after step ``end`` (or when training stops earlier);
it records CPU activity, and CUDA kernels on a GPU, with shapes and memory. Written to
``<run_dir>/profile/``:

- ``trace_steps_<start>-<end>.json``: a Chrome trace; open it in Perfetto
  (https://ui.perfetto.dev) or ``chrome://tracing``, or with TensorBoard's profiler plugin;
- on CUDA, ``memory_snapshot_steps_<start>-<end>.pickle``: the caching allocator's
  history over those steps (``torch.cuda.memory._record_memory_history``); drag it
  into https://pytorch.org/memory_viz.

A run that resumes past ``start`` profiles what is left of the range.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["StepProfiler"]


class StepProfiler:
    """Profile the steps ``[start, end]`` of a training loop (see the module docstring).

    Args:
        steps: ``[start, end]`` (1-based, inclusive) or None (nothing is profiled).
        out_dir: where the files go (created when profiling starts).
        device: the training device (CUDA adds kernels and the memory snapshot).
        enabled: False on ranks that do not write.
        log: called with a message naming the files once they are written.
    """

    def __init__(
        self,
        steps: list[int] | None,
        out_dir: Path,
        device: torch.device,
        *,
        enabled: bool = True,
        log: Any = None,
    ) -> None:
        self.range = (int(steps[0]), int(steps[1])) if steps and enabled else None
        self.out_dir = Path(out_dir)
        self.device = device
        self.log = log
        self._prof: torch.profiler.profile | None = None
        self._step_range: Any = None
        self.files: list[Path] = []

    def _cuda(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_available()

    def before_step(self, step: int) -> None:
        """Call before running step ``step`` (1-based): starts the profiler in range."""
        if self._prof is not None:
            self._mark(step)
            return
        if self.range is None:
            return
        start, end = self.range
        if not start <= step <= end:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._cuda():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        self._first = step
        self._prof = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True, with_stack=False
        )
        self._prof.__enter__()
        self._mark(step)

    def _mark(self, step: int) -> None:
        """Open the ``ProfilerStep#<step>`` range that groups one step's events in the trace."""
        self._step_range = torch.profiler.record_function(f"ProfilerStep#{step}")
        self._step_range.__enter__()

    def after_step(self, step: int) -> None:
        """Call after step ``step``: closes its range and stops the profiler after ``end``."""
        if self._prof is None:
            return
        self._close_mark()
        if step >= self.range[1]:
            self.close(step)

    def _close_mark(self) -> None:
        mark, self._step_range = self._step_range, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def close(self, last_step: int | None = None) -> None:
        """Stop profiling (if running) and write the files; safe to call more than once."""
        self._close_mark()
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if self._cuda():
            torch.cuda.synchronize(self.device)
        prof.__exit__(None, None, None)
        last = last_step if last_step is not None else self.range[1]
        tag = f"steps_{self._first}-{last}"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / f"trace_{tag}.json"
        prof.export_chrome_trace(str(trace))
        self.files.append(trace)
        if self._cuda():
            snapshot = self.out_dir / f"memory_snapshot_{tag}.pickle"
            torch.cuda.memory._dump_snapshot(str(snapshot))
            torch.cuda.memory._record_memory_history(enabled=None)
            self.files.append(snapshot)
        if self.log is not None:
            self.log(f"profile of steps {self._first}-{last}: {', '.join(map(str, self.files))}")
