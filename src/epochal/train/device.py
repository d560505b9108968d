"""The training device: ``training.device`` resolved to a ``torch.device``."""

from __future__ import annotations

import torch

from epochal.model.config import ConfigError

__all__ = ["resolve_device"]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cuda"`` without CUDA is a :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device", "is 'cuda' but no CUDA device is available")
    return torch.device(name)
