"""fp16 loss scaling, Megatron's way (``--fp16`` with ``--loss-scale`` or dynamic scaling).

Under float16 autocast small gradients underflow to zero; the loss is multiplied by
``scale`` before the backward and the gradients divided by it before clipping and the
optimizer step (parameters and optimizer state stay float32). A step whose gradients
hold an inf or NaN (overflow) is skipped: no optimizer step, no learning-rate step
(Megatron's ``update_successful = False``), and the dynamic scale reacts.

:class:`DynamicLossScaler` is Megatron-Core's ``DynamicGradScaler``, decision for decision:

- an overflow resets the growth tracker and lowers the hysteresis tracker; when that
  reaches 0 the scale is multiplied by ``backoff_factor`` (0.5), never below ``min_scale``;
- ``growth_interval`` consecutive clean steps (``--loss-scale-window``) multiply the
  scale by ``growth_factor`` (2) and refill the hysteresis tracker.

Its state (``scale``, ``growth_tracker``, ``hysteresis_tracker``; Megatron's names) goes
into each checkpoint, so a resumed run scales, skips and logs exactly as the
uninterrupted one. :class:`ConstantLossScaler` (``--loss-scale``) never changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from epochal.model.config import ConfigError

__all__ = [
    "ConstantLossScaler",
    "DynamicLossScaler",
    "build_loss_scaler",
    "check_fp16_support",
    "unscale_gradients",
]


class ConstantLossScaler:
    """A fixed loss scale (Megatron's ``ConstantGradScaler``); overflowing steps are still skipped.

    Args:
        scale: the loss scale (> 0).

    Raises:
        ValueError: ``scale <= 0``.
    """

    def __init__(self, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"loss scale must be > 0, got {scale}")
        self.scale = float(scale)

    def update(self, found_inf: bool) -> None:
        """Nothing changes."""

    def state_dict(self) -> dict[str, Any]:
        """``{"scale": ...}``, for the record (the configuration sets the scale on resume)."""
        return {"scale": self.scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore: the scale comes from the configuration."""


class DynamicLossScaler:
    """Megatron-Core's ``DynamicGradScaler`` (see the module docstring).

    Args:
        initial_scale: the first scale (Megatron's ``--initial-loss-scale``, 2**32).
        min_scale: the scale never goes below this (``--min-loss-scale``, 1.0).
        growth_factor: multiplier after ``growth_interval`` clean steps (> 1).
        backoff_factor: multiplier after ``hysteresis`` overflows (in (0, 1)).
        growth_interval: clean steps before growing (``--loss-scale-window``, 1000).
        hysteresis: overflows before lowering (``--hysteresis``, 2).

    Raises:
        ValueError: a value outside its range (named).
    """

    def __init__(
        self,
        initial_scale: float = 2.0**32,
        min_scale: float = 1.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 1000,
        hysteresis: int = 2,
    ) -> None:
        checks = (
            (min_scale > 0, "min_scale", "must be > 0", min_scale),
            (min_scale <= initial_scale, "initial_scale", "must be >= min_scale", initial_scale),
            (growth_factor > 1, "growth_factor", "must be > 1", growth_factor),
            (0 < backoff_factor < 1, "backoff_factor", "must be in (0, 1)", backoff_factor),
            (growth_interval >= 1, "growth_interval", "must be >= 1", growth_interval),
            (hysteresis >= 1, "hysteresis", "must be >= 1", hysteresis),
        )
        for ok, name, rule, value in checks:
            if not ok:
                raise ValueError(f"{name} {rule}, got {value}")
        self.scale = float(initial_scale)
        self.min_scale = float(min_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.hysteresis = int(hysteresis)
        self.growth_tracker = 0
        self.hysteresis_tracker = self.hysteresis

    def update(self, found_inf: bool) -> None:
        """React to one step: ``found_inf`` is whether its gradients overflowed."""
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * self.growth_factor

    def state_dict(self) -> dict[str, Any]:
        """``{"scale", "growth_tracker", "hysteresis_tracker"}`` (JSON numbers)."""
        return {
            "scale": self.scale,
            "growth_tracker": self.growth_tracker,
            "hysteresis_tracker": self.hysteresis_tracker,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values.

        Raises:
            KeyError / TypeError / ValueError: a missing or malformed value.
        """
        self.scale = float(state["scale"])
        self.growth_tracker = int(state["growth_tracker"])
        self.hysteresis_tracker = int(state["hysteresis_tracker"])


@torch.no_grad()
def unscale_gradients(parameters: Iterable[torch.Tensor], scale: float) -> None:
    """Divide every gradient by ``scale`` in place (DTensor gradients included).

    ``scale`` is a power of two for the dynamic scaler, so the division is exact.
    """
    inv = 1.0 / scale
    for p in parameters:
        if p.grad is not None:
            p.grad.mul_(inv)


def check_fp16_support(device: torch.device) -> None:
    """Refuse ``training.fp16`` on a device that cannot run float16 autocast.

    Runs a tiny linear layer forward and backward under ``torch.autocast(device.type,
    torch.float16)`` and checks the output is float16.

    Raises:
        ConfigError: (naming ``training.fp16``) the device has no float16 autocast.
    """
    try:
        x = torch.ones(2, 2, device=device, requires_grad=True)
        with torch.autocast(device.type, dtype=torch.float16):
            y = torch.nn.functional.linear(x, torch.ones(2, 2, device=device))
        if y.dtype != torch.float16:
            raise RuntimeError(f"autocast produced {y.dtype}, not float16")
        y.float().sum().backward()
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(
            "training.fp16",
            f"the {device.type} device has no float16 autocast ({exc}); "
            "use training.bf16 = true or no mixed precision",
        ) from exc


def build_loss_scaler(
    training: Any, device: torch.device
) -> ConstantLossScaler | DynamicLossScaler | None:
    """The loss scaler of a ``[training]`` section: None without ``fp16``.

    Raises:
        ConfigError: fp16 on a device without float16 autocast (see :func:`check_fp16_support`).
    """
    if not training.fp16:
        return None
    check_fp16_support(device)
    if training.loss_scale is not None:
        return ConstantLossScaler(training.loss_scale)
    return DynamicLossScaler(
        initial_scale=training.initial_loss_scale,
        min_scale=training.min_loss_scale,
        growth_interval=training.loss_scale_window,
        hysteresis=training.hysteresis,
    )
