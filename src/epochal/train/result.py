"""What one call of the trainer's ``train()`` did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrainResult"]


@dataclass
class TrainResult:
    """What a call to :meth:`Trainer.train` did.

    Attributes:
        run_dir: the run directory.
        start_step / final_step: steps before and after this call.
        last_loss: loss of the last step run (None if none ran).
        eval_loss: last validation loss (None if never evaluated).
        tokens_per_s: mean training throughput of this call (tokens/s, excluding eval/saves).
        wall_time_s: duration of this call in seconds.
        resumed_from: the checkpoint folder resumed from, if any.
        last_checkpoint: the newest checkpoint folder, if any.
        losses: the loss of every step run by this call, in order.
        stopped_by: why training stopped before ``training.train_iters`` after saving
            a checkpoint (``"SIGTERM"``, ``"training.exit_interval=5"``, ...), else None.
    """

    run_dir: Path
    start_step: int
    final_step: int
    last_loss: float | None = None
    eval_loss: float | None = None
    tokens_per_s: float = 0.0
    wall_time_s: float = 0.0
    resumed_from: str | None = None
    last_checkpoint: Path | None = None
    losses: list[float] = field(default_factory=list)
    stopped_by: str | None = None
