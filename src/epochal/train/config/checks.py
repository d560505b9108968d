"""The one validation helper every configuration section uses."""

from __future__ import annotations

from epochal.model.config import ConfigError


def _require(cond: bool, option: str, message: str) -> None:
    if not cond:
        raise ConfigError(option, message)
