"""DCP ``Stateful`` wrapper of the model parts.

``ModelState(model_parts).state_dict()`` merges the FQN-keyed state dicts of all
parts (``torch.distributed.checkpoint.state_dict.get_model_state_dict``; layer
keys are global, so parts never collide); ``load_state_dict`` gives each part
the keys it owns. Non-persistent buffers (RoPE tables, ALiBi slopes) are not
saved; they are recomputed from the config.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)

__all__ = ["ModelState"]


class ModelState:
    """The model parts as one DCP ``Stateful``."""

    def __init__(self, model_parts: Sequence[nn.Module]) -> None:
        self.model_parts = list(model_parts)

    def state_dict(self) -> dict[str, Any]:
        """FQN -> tensor for every part (tied weights appear under both names)."""
        merged: dict[str, Any] = {}
        for part in self.model_parts:
            merged.update(get_model_state_dict(part))
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load each part's keys from ``state_dict`` (which may hold other parts' keys too)."""
        options = StateDictOptions(strict=len(self.model_parts) == 1)
        for part in self.model_parts:
            own = set(part.state_dict())
            set_model_state_dict(
                part, {k: v for k, v in state_dict.items() if k in own}, options=options
            )
