"""What one ``train()`` call records while it runs: step timing, metrics, evidence, its result.

:class:`RunRecorder` is opened by the trainer at the start of a call and closed at
its end. Around each optimizer step it times the step, counts its samples and
tokens, drives the profiler, writes the train record (``metrics.jsonl``,
TensorBoard, W&B) with the data's evidence (:class:`DataRecords`), and fills the
call's :class:`~epochal.train.result.TrainResult`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from epochal._atomic import atomic_write
from epochal.train.config import TrainConfig, to_toml
from epochal.train.observe.data_records import DataRecords
from epochal.train.observe.metrics import MetricsLogger
from epochal.train.observe.profiling import StepProfiler
from epochal.train.observe.run_metrics import open_run_metrics
from epochal.train.observe.throughput import ThroughputMeter
from epochal.train.result import TrainResult, skipped_line
from epochal.train.state.run_dir import archive_previous_history

__all__ = ["RunRecorder", "open_run_records"]


def open_run_records(
    config: TrainConfig,
    run_dir: Path,
    *,
    resumed_from: Path | None,
    start_step: int,
    eval_history: list[tuple[int, float]],
    sample_check: str | None,
    loader: Any,
    meter: ThroughputMeter,
    device: torch.device,
    rank: int,
    log: bool,
) -> RunRecorder:
    """Start the records of a training call.

    Rank 0 first moves an earlier history aside on a fresh start
    (:func:`~epochal.train.state.run_dir.archive_previous_history`) and writes
    ``run_dir/config.toml``; then the metrics sinks open (written on rank 0 only),
    with the data's evidence and the profiler on the rank that writes them.

    Args:
        config: the resolved configuration (written to ``config.toml``).
        run_dir: the run directory.
        resumed_from: the checkpoint resumed from (None: a fresh start).
        start_step: the step the call starts from.
        eval_history: the run's ``(step, validation loss)`` so far (the result's
            ``eval_loss`` starts at the last one).
        sample_check: a resume's sample-check line (kept in the result).
        loader: the train loader.
        meter: tokens/s, MFU and memory of each record.
        device: the device (profiling).
        rank: global rank.
        log: print messages and the progress bar.
    """
    result = TrainResult(
        run_dir=run_dir,
        start_step=start_step,
        final_step=start_step,
        resumed_from=str(resumed_from) if resumed_from is not None else None,
        last_checkpoint=resumed_from,
        sample_check=sample_check,
    )
    if eval_history:
        result.eval_loss = eval_history[-1][1]
    if rank == 0:
        if (
            resumed_from is None
        ):  # a fresh start: an earlier history is moved aside, not appended to
            archive_previous_history(run_dir, log=(lambda m: print(m, flush=True)) if log else None)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(run_dir / "config.toml", to_toml(config))
    metrics = open_run_metrics(
        config,
        run_dir,
        start_step=start_step,
        resumed_from=result.resumed_from,
        enabled=rank == 0,
        verbose=log,
    )
    if resumed_from is not None and log:
        metrics.write_line(f"resumed from {resumed_from} at step {start_step}")
    evidence = (  # sample digests and per-epoch evidence (epochal.train.observe.data_records)
        DataRecords(loader.dataset, config.training.micro_batch_size) if metrics.enabled else None
    )
    profiler = StepProfiler(
        config.logging.profile_steps,
        run_dir / "profile",
        device,
        enabled=metrics.enabled,
        log=metrics.write_line,
    )
    return RunRecorder(
        result,
        metrics,
        loader=loader,
        tokens_per_sample=config.data.seq_length,
        meter=meter,
        profiler=profiler,
        evidence=evidence,
    )


class RunRecorder:
    """The records of one training call (see the module docstring).

    Args:
        result: the call's result, filled as steps run (losses, skipped steps, and at
            :meth:`finish` the throughput, hardware and profile files).
        metrics: the run's metrics sinks.
        loader: the train loader (its ``consumed_samples`` counts a step's samples).
        tokens_per_sample: ``data.seq_length``.
        meter: tokens/s, MFU and memory of each record.
        profiler: the steps to profile.
        evidence: sample digests and per-epoch evidence (None: not recorded on this rank).
    """

    def __init__(
        self,
        result: TrainResult,
        metrics: MetricsLogger,
        *,
        loader: Any,
        tokens_per_sample: int,
        meter: ThroughputMeter,
        profiler: StepProfiler,
        evidence: DataRecords | None = None,
    ) -> None:
        self.result = result
        self.metrics = metrics
        self.loader = loader
        self.tokens_per_sample = tokens_per_sample
        self.meter = meter
        self.profiler = profiler
        self.evidence = evidence
        #: seconds spent in optimizer steps (evaluations and saves excluded), and their tokens
        self.train_time = 0.0
        self.trained_tokens = 0
        self._t0 = 0.0
        self._samples_before = 0
        self._dt = 0.0
        self._tokens = 0

    def start_step(self, step: int) -> None:
        """Before optimizer step ``step`` (1-based): start its clock (and the profiler in range)."""
        self.profiler.before_step(step)
        self._t0 = time.perf_counter()
        self._samples_before = self.loader.consumed_samples

    def end_step(self, step: int) -> int:
        """After optimizer step ``step``: stop its clock; returns its tokens (samples x
        ``tokens_per_sample``)."""
        samples = self.loader.consumed_samples - self._samples_before
        self._tokens = samples * self.tokens_per_sample
        self._dt = time.perf_counter() - self._t0
        self.train_time += self._dt
        self.trained_tokens += self._tokens
        self.profiler.after_step(step)
        return self._tokens

    def record(self, step: int, out: dict[str, Any], tokens_seen: int) -> dict[str, Any]:
        """Write the train record of step ``step`` and add it to the result.

        Args:
            step: the optimizer step just done (1-based).
            out: what the step returned (``loss``, ``grad_norm``, ``lr``, ``skipped``, ...).
            tokens_seen: training tokens of the run so far, this step's included.

        Returns:
            The record: ``out`` with ``consumed_samples``, ``tokens``, the throughput
            fields and ``step_time_s`` (seconds).
        """
        record = {
            **out,
            "consumed_samples": self.loader.consumed_samples,
            "tokens": tokens_seen,
            **self.meter.step_fields(self._tokens, self._dt),
            "step_time_s": self._dt,
        }
        if self.evidence is not None:
            after = self.loader.consumed_samples
            self.evidence.annotate(
                record, self._samples_before, after, step, self.metrics.log_record
            )
        self.metrics.log_train(step, record)
        self.result.losses.append(out["loss"])
        self.result.last_loss = out["loss"]
        self.result.skipped_steps += int(out["skipped"])
        return record

    def close(self, step: int) -> None:
        """End the call's records at ``step`` (the profiler, a skipped-steps line, the sinks)."""
        self.profiler.close(step)
        if self.result.skipped_steps:
            self.metrics.write_line(
                skipped_line(self.result.skipped_steps, len(self.result.losses))
            )
        self.metrics.close()

    def finish(self, step: int, started: float) -> TrainResult:
        """The call's result, reaching ``step``, with its throughput and the ``perf_counter``
        seconds since ``started``."""
        result = self.result
        result.final_step = step
        result.tokens_per_s = self.trained_tokens / self.train_time if self.train_time > 0 else 0.0
        result.mfu = self.meter.mfu(result.tokens_per_s)
        result.hardware = self.meter.describe()
        result.utilization = self.meter.summary(result.tokens_per_s)
        result.profile_files = self.profiler.files
        result.wall_time_s = time.perf_counter() - started
        return result
