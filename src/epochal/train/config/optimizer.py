"""The ``[optimizer]`` section: AdamW and gradient clipping (Megatron's names)."""

from __future__ import annotations

from dataclasses import dataclass

from epochal.train.config.checks import _require

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

    lr: float = 3e-4
    min_lr: float = 0.0
    weight_decay: float = 0.01
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0

    def __post_init__(self) -> None:
        _require(self.lr >= 0, "lr", f"must be >= 0, got {self.lr}")
        _require(
            0 <= self.min_lr <= self.lr,
            "min_lr",
            f"must be in [0, lr={self.lr}], got {self.min_lr}",
        )
        _require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        for name in ("start_weight_decay", "end_weight_decay"):
            v = getattr(self, name)
            _require(v is None or v >= 0, name, f"must be >= 0, got {v}")
        _require(
            self.wd_start <= self.wd_end,
            "end_weight_decay",
            f"must be >= start_weight_decay={self.wd_start}, got {self.wd_end}",
        )
        for name in ("adam_beta1", "adam_beta2"):
            v = getattr(self, name)
            _require(0 <= v < 1, name, f"must be in [0, 1), got {v}")
        _require(self.adam_eps > 0, "adam_eps", f"must be > 0, got {self.adam_eps}")
        _require(self.clip_grad >= 0, "clip_grad", f"must be >= 0 (0 = off), got {self.clip_grad}")

    @property
    def wd_start(self) -> float:
        """Weight decay at step 0."""
        return self.weight_decay if self.start_weight_decay is None else self.start_weight_decay

    @property
    def wd_end(self) -> float:
        """Weight decay at the end of the increment."""
        return self.weight_decay if self.end_weight_decay is None else self.end_weight_decay
