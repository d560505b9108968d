"""Learning-rate and weight-decay schedule with Megatron-LM's ``OptimizerParamScheduler`` semantics.

Same formulas and edge cases as ``megatron.core.optimizer_param_scheduler``
(peer-tested against it):

- LR: linear warmup from ``init_lr`` to ``max_lr`` over ``lr_warmup_steps`` (the
  warmup branch includes step ``lr_warmup_steps``); then ``constant`` (stays at
  ``max_lr``), or, up to ``lr_decay_steps``, ``linear`` / ``cosine`` decay to
  ``min_lr``, ``inverse-square-root`` (``max_lr * sqrt(warmup / step)``, floored
  at ``min_lr``) or ``WSD`` (constant, then the last ``wsd_decay_steps`` annealed
  with ``lr_wsd_decay_style`` in ``linear|cosine|exponential|minus_sqrt``);
  ``min_lr`` after ``lr_decay_steps``.
- Weight decay: from ``start_wd`` to ``end_wd`` over ``wd_incr_steps`` with style
  ``constant`` (requires ``start_wd == end_wd``), ``linear`` or ``cosine``.
- Per parameter group: ``max_lr``/``min_lr``/``start_wd``/``end_wd`` overrides and
  ``wd_mult`` (0 for the no-weight-decay group) as in Megatron; ``lr_mult``
  multiplies the learning rate (Megatron's ``lr_mult`` override).

Units: "steps" are whatever the caller increments by. Megatron counts samples
(``increment = global batch size``); epochal's trainer counts optimizer steps
(``increment = 1``), which gives the same values for a constant global batch.
Invalid settings raise ``ValueError`` (Megatron asserts).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = [
    "LR_DECAY_STYLES",
    "WD_INCR_STYLES",
    "WSD_DECAY_STYLES",
    "OptimizerParamScheduler",
    "scheduler_from_config",
]

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
WD_INCR_STYLES = ("constant", "linear", "cosine")


class OptimizerParamScheduler:
    """Sets ``lr`` and ``weight_decay`` of every optimizer parameter group at each step.

    Args:
        optimizer: any ``torch.optim.Optimizer`` (its ``param_groups`` are written).
        init_lr: learning rate at step 0 of the warmup.
        max_lr: peak learning rate (end of warmup).
        min_lr: floor of the decay.
        lr_warmup_steps: warmup length (>= 0, < ``lr_decay_steps``).
        lr_decay_steps: step at which the decay reaches ``min_lr`` (> 0).
        lr_decay_style: one of :data:`LR_DECAY_STYLES`.
        start_wd / end_wd: weight decay at step 0 / after ``wd_incr_steps``.
        wd_incr_steps: length of the weight-decay ramp (> 0 unless constant).
        wd_incr_style: one of :data:`WD_INCR_STYLES`.
        wsd_decay_steps: annealing length of ``WSD`` (required for it).
        lr_wsd_decay_style: one of :data:`WSD_DECAY_STYLES`.

    Raises:
        ValueError: an invalid combination (the message names the argument).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        init_lr: float,
        max_lr: float,
        min_lr: float,
        lr_warmup_steps: int,
        lr_decay_steps: int,
        lr_decay_style: str,
        start_wd: float,
        end_wd: float,
        wd_incr_steps: int,
        wd_incr_style: str,
        wsd_decay_steps: int | None = None,
        lr_wsd_decay_style: str | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.init_lr = float(init_lr)
        self.max_lr = float(max_lr)
        self.min_lr = float(min_lr)
        self.lr_warmup_steps = int(lr_warmup_steps)
        self.lr_decay_steps = int(lr_decay_steps)
        self.lr_decay_style = lr_decay_style
        self.start_wd = float(start_wd)
        self.end_wd = float(end_wd)
        self.wd_incr_steps = int(wd_incr_steps)
        self.wd_incr_style = wd_incr_style
        self.wsd_decay_steps = wsd_decay_steps
        self.lr_wsd_decay_style = lr_wsd_decay_style
        self.num_steps = 0
        self._validate()
        self.step(0)

    def _validate(self) -> None:
        if self.min_lr < 0:
            raise ValueError(f"min_lr must be >= 0, got {self.min_lr}")
        if self.max_lr < self.min_lr:
            raise ValueError(f"max_lr ({self.max_lr}) must be >= min_lr ({self.min_lr})")
        if not 0 <= self.init_lr <= self.max_lr:
            raise ValueError(f"init_lr must be in [0, max_lr={self.max_lr}], got {self.init_lr}")
        if self.lr_decay_steps <= 0:
            raise ValueError(f"lr_decay_steps must be > 0, got {self.lr_decay_steps}")
        if not 0 <= self.lr_warmup_steps < self.lr_decay_steps:
            raise ValueError(
                f"lr_warmup_steps must be in [0, lr_decay_steps={self.lr_decay_steps}), got {self.lr_warmup_steps}"
            )
        if self.lr_decay_style not in LR_DECAY_STYLES:
            raise ValueError(
                f"lr_decay_style must be one of {LR_DECAY_STYLES}, got {self.lr_decay_style!r}"
            )
        if self.lr_decay_style == "WSD":
            if self.wsd_decay_steps is None or not 0 < self.wsd_decay_steps <= self.lr_decay_steps:
                raise ValueError(
                    f"wsd_decay_steps must be in (0, lr_decay_steps={self.lr_decay_steps}] for WSD, "
                    f"got {self.wsd_decay_steps}"
                )
            if self.lr_wsd_decay_style not in WSD_DECAY_STYLES:
                raise ValueError(
                    f"lr_wsd_decay_style must be one of {WSD_DECAY_STYLES}, got {self.lr_wsd_decay_style!r}"
                )
        if self.start_wd < 0 or self.end_wd < self.start_wd:
            raise ValueError(
                f"need 0 <= start_wd <= end_wd, got start_wd={self.start_wd}, end_wd={self.end_wd}"
            )
        if self.wd_incr_style not in WD_INCR_STYLES:
            raise ValueError(
                f"wd_incr_style must be one of {WD_INCR_STYLES}, got {self.wd_incr_style!r}"
            )
        if self.wd_incr_style == "constant" and self.start_wd != self.end_wd:
            raise ValueError(
                f"constant weight decay needs start_wd == end_wd, got {self.start_wd} and {self.end_wd}"
            )
        if self.wd_incr_style != "constant" and self.wd_incr_steps <= 0:
            raise ValueError(
                f"wd_incr_steps must be > 0 for {self.wd_incr_style!r}, got {self.wd_incr_steps}"
            )

    # ---------------------------------------------------------------- formulas
    def get_wd(self, param_group: dict[str, Any] | None = None) -> float:
        """Weight decay at the current step (before the group's ``wd_mult``)."""
        group = param_group or {}
        start_wd = group.get("start_wd", self.start_wd)
        end_wd = group.get("end_wd", self.end_wd)
        if self.num_steps > self.wd_incr_steps or self.wd_incr_style == "constant":
            return end_wd
        ratio = self.num_steps / self.wd_incr_steps
        if self.wd_incr_style == "linear":
            coeff = ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        return start_wd + coeff * (end_wd - start_wd)

    def get_lr(self, param_group: dict[str, Any] | None = None) -> float:
        """Learning rate at the current step (before the group's ``lr_mult``)."""
        group = param_group or {}
        max_lr = group.get("max_lr", self.max_lr)
        min_lr = group.get("min_lr", self.min_lr)
        n = self.num_steps
        if self.lr_warmup_steps > 0 and n <= self.lr_warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * n / self.lr_warmup_steps
        if self.lr_decay_style == "constant":
            return max_lr
        if n > self.lr_decay_steps:
            return min_lr
        if self.lr_decay_style == "inverse-square-root":
            warmup = max(self.lr_warmup_steps, 1)
            return max(min_lr, max_lr * warmup**0.5 / max(n, 1) ** 0.5)
        ratio = (n - self.lr_warmup_steps) / (self.lr_decay_steps - self.lr_warmup_steps)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:  # WSD
            anneal_start = self.lr_decay_steps - self.wsd_decay_steps
            if n <= anneal_start:
                coeff = 1.0
            else:
                r = (n - anneal_start) / self.wsd_decay_steps
                style = self.lr_wsd_decay_style
                if style == "linear":
                    coeff = 1.0 - r
                elif style == "cosine":
                    coeff = 0.5 * (math.cos(math.pi * r) + 1.0)
                elif style == "exponential":
                    coeff = 2.0 * math.pow(0.5, r) - 1.0
                else:  # minus_sqrt
                    coeff = 1.0 - math.sqrt(r)
        return min_lr + coeff * (max_lr - min_lr)

    def step(self, increment: int = 1) -> None:
        """Advance by ``increment`` steps and write ``lr``/``weight_decay`` into every group."""
        self.num_steps += int(increment)
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group) * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.get_wd(group) * group.get("wd_mult", 1.0)

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """JSON-serializable state (Megatron's keys)."""
        return {
            "max_lr": self.max_lr,
            "min_lr": self.min_lr,
            "lr_warmup_steps": self.lr_warmup_steps,
            "lr_decay_steps": self.lr_decay_steps,
            "lr_decay_style": self.lr_decay_style,
            "num_steps": self.num_steps,
            "start_wd": self.start_wd,
            "end_wd": self.end_wd,
            "wd_incr_style": self.wd_incr_style,
            "wd_incr_steps": self.wd_incr_steps,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the step count; the schedule's settings come from the current config.

        Like Megatron's ``--override-opt-param-scheduler``, a changed schedule in the
        config wins over the checkpoint's (so a run can be extended or re-annealed).
        """
        self.num_steps = 0
        self.step(int(state_dict["num_steps"]))


def scheduler_from_config(optimizer: Any, config: Any) -> OptimizerParamScheduler:
    """The scheduler of a training configuration (``optimizer.*``, ``scheduler.*``, ``lr_*_iters``).

    Args:
        optimizer: anything with ``param_groups`` (an ``OptimizersContainer``).
        config: a resolved ``TrainConfig``.
    """
    c, o, s = config, config.optimizer, config.scheduler
    return OptimizerParamScheduler(
        optimizer,
        init_lr=s.lr_warmup_init,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=c.lr_warmup_iters,
        lr_decay_steps=c.lr_decay_iters,
        lr_decay_style=s.lr_decay_style,
        start_wd=o.wd_start,
        end_wd=o.wd_end,
        wd_incr_steps=c.lr_decay_iters,
        wd_incr_style=s.weight_decay_incr_style,
        wsd_decay_steps=s.lr_wsd_decay_iters,
        lr_wsd_decay_style=s.lr_wsd_decay_style,
    )
