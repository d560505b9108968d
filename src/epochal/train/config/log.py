"""The ``[logging]`` section: progress bar, TensorBoard, log interval, W&B."""

from __future__ import annotations

from dataclasses import dataclass

from epochal.train.config.checks import _require

__all__ = [
    "LoggingConfig",
]


@dataclass(kw_only=True)
class LoggingConfig:
    """The ``[logging]`` section.

    Attributes:
        log_interval: refresh the progress bar / TensorBoard every this many steps
            (the JSONL file gets every step).
        progress: show a tqdm progress bar.
        tensorboard: write TensorBoard events to ``<run_dir>/tensorboard`` when installed.
        wandb: also log to Weights & Biases (the ``wandb`` extra; see
            :mod:`epochal.train.observe.wandb_logger`: offline without credentials).
        wandb_project / wandb_name: the W&B project and run name (default name: the
            run directory's name).
        wandb_dir: where W&B writes its files (default: the run directory).
        wandb_mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``""`` (automatic:
            ``$WANDB_MODE``, else online with credentials, offline without).
    """

    log_interval: int = 10
    progress: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "epochal"
    wandb_name: str = ""
    wandb_dir: str = ""
    wandb_mode: str = ""

    def __post_init__(self) -> None:
        _require(self.log_interval >= 1, "log_interval", f"must be >= 1, got {self.log_interval}")
        _require(
            self.wandb_mode in ("", "online", "offline", "disabled"),
            "wandb_mode",
            f"must be '', 'online', 'offline' or 'disabled', got {self.wandb_mode!r}",
        )
