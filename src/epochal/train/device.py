"""The training device: ``training.device`` resolved, and the compute context of a forward pass."""

from __future__ import annotations

import contextlib

import torch

from epochal.model.config import ConfigError

__all__ = ["compute_context", "resolve_device", "sdpa_backends"]


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cuda"`` without CUDA is a :class:`ConfigError`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device", "is 'cuda' but no CUDA device is available")
    return torch.device(name)


def sdpa_backends(choice: str) -> list | None:
    """The ``torch.nn.attention.SDPBackend`` list for ``training.attention_backend`` (None = auto)."""
    if choice == "auto":
        return None
    from torch.nn.attention import SDPBackend

    return [
        {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH,
        }[choice]
    ]


def compute_context(
    device: torch.device, *, bf16: bool, fp16: bool, attention_backend: str = "auto"
) -> contextlib.AbstractContextManager:
    """bfloat16 / float16 autocast (or none) and the allowed attention kernels, as one context."""
    stack = contextlib.ExitStack()
    if bf16:
        stack.enter_context(torch.autocast(device.type, dtype=torch.bfloat16))
    elif fp16:
        stack.enter_context(torch.autocast(device.type, dtype=torch.float16))
    backends = sdpa_backends(attention_backend)
    if backends is not None:
        from torch.nn.attention import sdpa_kernel

        stack.enter_context(sdpa_kernel(backends))
    return stack
