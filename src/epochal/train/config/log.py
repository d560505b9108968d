"""The ``[logging]`` section: progress bar, TensorBoard, log interval, W&B."""

from __future__ import annotations

from dataclasses import dataclass

from epochal._checks import check_fields, checked, require

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
        peak_tflops: the device's peak TFLOP/s that MFU is measured against (> 0);
            None = the detected GPU's dense bf16 peak
            (:data:`epochal.train.observe.throughput.PEAK_BF16_TFLOPS`), and no MFU
            on the CPU or an unknown GPU.
        profile_steps: ``[start, end]`` (1-based optimizer steps, inclusive): write a
            ``torch.profiler`` Chrome trace of those steps (and a CUDA memory snapshot
            on a GPU) to ``<run_dir>/profile/``; None = no profiling
            (:mod:`epochal.train.observe.profiling`).
    """

    log_interval: int = checked(10, ge=1)
    progress: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "epochal"
    wandb_name: str = ""
    wandb_dir: str = ""
    wandb_mode: str = ""
    peak_tflops: float | None = checked(None, gt=0, text="> 0 (or unset: the detected GPU's)")
    profile_steps: list[int] | None = None

    def __post_init__(self) -> None:
        check_fields(self)
        p = self.profile_steps
        require(
            p is None
            or (
                isinstance(p, list)
                and len(p) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in p)
                and 1 <= p[0] <= p[1]
            ),
            "profile_steps",
            f"must be [start, end] with 1 <= start <= end (or unset), got {p!r}",
        )
        require(
            self.wandb_mode in ("", "online", "offline", "disabled"),
            "wandb_mode",
            f"must be '', 'online', 'offline' or 'disabled', got {self.wandb_mode!r}",
        )
