"""The ``[scheduler]`` section: LR warmup/decay and the weight-decay increment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from epochal._checks import check_fields, checked, require

__all__ = [
    "SchedulerConfig",
]


@dataclass(kw_only=True)
class SchedulerConfig:
    """The ``[scheduler]`` section (Megatron's ``OptimizerParamScheduler``; units: optimizer steps).

    Attributes:
        lr_decay_style: ``constant``, ``linear``, ``cosine``, ``inverse-square-root`` or ``WSD``.
        lr_warmup_iters: linear warmup steps (>= 0).
        lr_warmup_fraction: if set, warmup = this fraction of ``lr_decay_iters`` (in [0, 1));
            Megatron's ``--lr-warmup-fraction``, exclusive with a non-zero ``lr_warmup_iters``.
            The presets use it, so a shortened run keeps a proportionate warmup.
        lr_warmup_init: learning rate at step 0 (in [0, optimizer.lr]).
        lr_decay_iters: steps until ``min_lr`` (default ``training.train_iters``).
        lr_wsd_decay_iters: annealing steps of ``WSD``.
        lr_wsd_decay_style: ``linear``, ``cosine``, ``exponential`` or ``minus_sqrt``.
        weight_decay_incr_style: ``constant``, ``linear`` or ``cosine`` (over ``lr_decay_iters``).
    """

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = checked(
        "cosine"
    )
    lr_warmup_iters: int = checked(0, ge=0)
    lr_warmup_fraction: float | None = checked(None, ge=0, lt=1)
    lr_warmup_init: float = checked(0.0, ge=0)
    lr_decay_iters: int | None = checked(None, ge=1, none="training.train_iters")
    lr_wsd_decay_iters: int | None = checked(None, ge=1)
    lr_wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = checked(
        "exponential"
    )
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = checked("constant")

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            self.lr_warmup_fraction is None or self.lr_warmup_iters == 0,
            "lr_warmup_fraction",
            f"and lr_warmup_iters={self.lr_warmup_iters} are both set; set one "
            "(as Megatron's --lr-warmup-fraction / --lr-warmup-iters)",
        )
