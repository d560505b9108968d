"""Open a run's metrics sinks from the configuration: JSONL, progress bar, TensorBoard, W&B."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from epochal.train.config import TrainConfig
from epochal.train.observe.metrics import MetricsLogger

__all__ = ["open_run_metrics"]


def open_run_metrics(
    config: TrainConfig,
    run_dir: Path,
    *,
    start_step: int,
    resumed_from: str | None,
    enabled: bool,
    verbose: bool,
) -> MetricsLogger:
    """The :class:`MetricsLogger` of a training call, with W&B opened if ``logging.wandb``.

    Args:
        config: the resolved configuration (``logging.*``, ``training.train_iters``).
        run_dir: the run directory (``metrics.jsonl`` and ``tensorboard/`` go there).
        start_step: the step training starts from (0, or the resumed step).
        resumed_from: the checkpoint folder resumed from, if any.
        enabled: whether this rank writes (the logging rank only).
        verbose: print messages and the progress bar (if ``logging.progress``).
    """
    lg = config.logging
    wandb = None
    if lg.wandb and enabled:
        from epochal.train.observe.wandb_logger import open_wandb

        wandb = open_wandb(
            run_dir,
            project=lg.wandb_project,
            name=lg.wandb_name,
            directory=lg.wandb_dir,
            mode=lg.wandb_mode,
            config=dataclasses.asdict(config),
        )
    return MetricsLogger(
        run_dir,
        total_steps=config.training.train_iters,
        start_step=start_step,
        resumed_from=resumed_from,
        progress=verbose and lg.progress,
        tensorboard=lg.tensorboard,
        log_interval=lg.log_interval,
        enabled=enabled,
        verbose=verbose,
        wandb=wandb,
    )
