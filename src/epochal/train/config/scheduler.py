"""The ``[scheduler]`` section: LR warmup/decay and the weight-decay increment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from epochal.train.config.checks import _require
from epochal.train.optim.lr_schedule import LR_DECAY_STYLES, WD_INCR_STYLES, WSD_DECAY_STYLES

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

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_warmup_init: float = 0.0
    lr_decay_iters: int | None = None
    lr_wsd_decay_iters: int | None = None
    lr_wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "exponential"
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"

    def __post_init__(self) -> None:
        _require(
            self.lr_decay_style in LR_DECAY_STYLES,
            "lr_decay_style",
            f"must be one of {LR_DECAY_STYLES}, got {self.lr_decay_style!r}",
        )
        _require(
            self.lr_wsd_decay_style in WSD_DECAY_STYLES,
            "lr_wsd_decay_style",
            f"must be one of {WSD_DECAY_STYLES}, got {self.lr_wsd_decay_style!r}",
        )
        _require(
            self.weight_decay_incr_style in WD_INCR_STYLES,
            "weight_decay_incr_style",
            f"must be one of {WD_INCR_STYLES}, got {self.weight_decay_incr_style!r}",
        )
        _require(
            self.lr_warmup_iters >= 0,
            "lr_warmup_iters",
            f"must be >= 0, got {self.lr_warmup_iters}",
        )
        _require(
            self.lr_warmup_fraction is None or 0 <= self.lr_warmup_fraction < 1,
            "lr_warmup_fraction",
            f"must be in [0, 1), got {self.lr_warmup_fraction}",
        )
        _require(
            self.lr_warmup_fraction is None or self.lr_warmup_iters == 0,
            "lr_warmup_fraction",
            f"and lr_warmup_iters={self.lr_warmup_iters} are both set; set one "
            "(as Megatron's --lr-warmup-fraction / --lr-warmup-iters)",
        )
        _require(
            self.lr_warmup_init >= 0, "lr_warmup_init", f"must be >= 0, got {self.lr_warmup_init}"
        )
        _require(
            self.lr_decay_iters is None or self.lr_decay_iters >= 1,
            "lr_decay_iters",
            f"must be >= 1, got {self.lr_decay_iters}",
        )
        _require(
            self.lr_wsd_decay_iters is None or self.lr_wsd_decay_iters >= 1,
            "lr_wsd_decay_iters",
            f"must be >= 1, got {self.lr_wsd_decay_iters}",
        )
