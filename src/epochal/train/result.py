"""What one call of the trainer's ``train()`` did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrainResult", "skipped_line"]


@dataclass
class TrainResult:
    """What a call to :meth:`Trainer.train` did.

    Attributes:
        run_dir: the run directory.
        start_step / final_step: steps before and after this call.
        last_loss: loss of the last step run (None if none ran).
        eval_loss: last validation loss (None if never evaluated).
        eval_ppl: its perplexity, when the loss is a token cross-entropy (GPT, T5: the
            loss; BERT / ESM: the masked-LM loss alone), else None (fine-tuning heads).
        tokens_per_s: mean training throughput of this call (tokens/s, excluding eval/saves).
        wall_time_s: duration of this call in seconds.
        resumed_from: the checkpoint folder resumed from, if any.
        last_checkpoint: the newest checkpoint folder, if any.
        losses: the loss of every step run by this call, in order.
        stopped_by: why training stopped before ``training.train_iters`` after saving
            a checkpoint (``"SIGTERM"``, ``"training.exit_interval=5"``, ...), else None.
        mfu: model FLOPs utilization at ``tokens_per_s`` (a fraction; None without a
            known peak: :mod:`epochal.train.observe.throughput`).
        hardware: the device, dtype and attention backend (``"NVIDIA H100 80GB HBM3,
            bf16, sdpa[auto: ...], peak 989 TFLOP/s"``).
        utilization: MFU and peak memory in words, for the summary line.
        profile_files: the profiler trace (and CUDA memory snapshot) written, if any.
        skipped_steps: steps of this call whose gradients were not finite (an fp16
            overflow, a NaN): the optimizer and the schedule did not step.
        sample_check: after a resume, one line on whether this run's data names the
            samples the checkpoint recorded (:mod:`epochal.train.state.sample_check`).
    """

    run_dir: Path
    start_step: int
    final_step: int
    last_loss: float | None = None
    eval_loss: float | None = None
    eval_ppl: float | None = None
    tokens_per_s: float = 0.0
    wall_time_s: float = 0.0
    resumed_from: str | None = None
    last_checkpoint: Path | None = None
    losses: list[float] = field(default_factory=list)
    stopped_by: str | None = None
    mfu: float | None = None
    hardware: str = ""
    utilization: str = ""
    profile_files: list[Path] = field(default_factory=list)
    skipped_steps: int = 0
    sample_check: str | None = None


def skipped_line(skipped: int, steps: int) -> str:
    """The run summary's line about steps skipped for non-finite gradients."""
    return (
        f"{skipped} of {steps} steps skipped: their gradients were not finite (inf/NaN), so "
        "neither the weights nor the learning-rate schedule moved (an fp16 overflow lowers "
        "the loss scale; otherwise look for extreme inputs or labels, or lower optimizer.lr)"
    )
