"""The ``[optimizer]`` section: AdamW and gradient clipping (Megatron's names)."""

from __future__ import annotations

from dataclasses import dataclass

from epochal._checks import check_fields, checked, require

__all__ = [
    "OptimizerConfig",
]


@dataclass(kw_only=True)
class OptimizerConfig:
    """The ``[optimizer]`` section (AdamW; Megatron's argument names).

    Attributes:
        lr: peak learning rate (>= 0; 0 keeps the weights, e.g. to evaluate a model).
        min_lr: learning rate at the end of the decay (0 <= min_lr <= lr).
        weight_decay: decoupled weight decay (>= 0); biases and norms get none.
        start_weight_decay / end_weight_decay: for an increasing weight decay
            (``scheduler.weight_decay_incr_style`` linear/cosine); default ``weight_decay``.
        adam_beta1, adam_beta2: Adam's decay rates of the first and second moment
            estimates, in [0, 1).
        adam_eps: the epsilon added to Adam's denominator (> 0).
        clip_grad: clip gradients to this global L2 norm (0 = no clipping).
    """

    lr: float = checked(3e-4, ge=0)
    min_lr: float = 0.0
    weight_decay: float = checked(0.01, ge=0)
    start_weight_decay: float | None = checked(None, ge=0, none="weight_decay")
    end_weight_decay: float | None = checked(None, ge=0, none="weight_decay")
    adam_beta1: float = checked(0.9, ge=0, lt=1)
    adam_beta2: float = checked(0.999, ge=0, lt=1)
    adam_eps: float = checked(1e-8, gt=0)
    clip_grad: float = checked(1.0, ge=0, note="0 = off")

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            0 <= self.min_lr <= self.lr,
            "min_lr",
            f"must be in [0, lr={self.lr}], got {self.min_lr}",
        )
        require(
            self.wd_start <= self.wd_end,
            "end_weight_decay",
            f"must be >= start_weight_decay={self.wd_start}, got {self.wd_end}",
        )

    @property
    def wd_start(self) -> float:
        """Weight decay at step 0."""
        return self.weight_decay if self.start_weight_decay is None else self.start_weight_decay

    @property
    def wd_end(self) -> float:
        """Weight decay at the end of the increment."""
        return self.weight_decay if self.end_weight_decay is None else self.end_weight_decay
