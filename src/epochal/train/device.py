"""The training device: ``training.device`` resolved, the compute context of a forward pass, deterministic kernels."""

from __future__ import annotations

import contextlib
import os

import torch

from epochal.model.config import ConfigError

__all__ = ["compute_context", "resolve_device", "sdpa_backends", "use_deterministic_kernels"]

#: cuBLAS's setting for reproducible results (NVIDIA: ``:4096:8`` or ``:16:8``).
CUBLAS_WORKSPACE = ":4096:8"


def resolve_device(name: str, *, deterministic: bool = False) -> torch.device:
    """``"auto"`` -> CUDA if available else CPU; ``"cuda"`` without CUDA is a :class:`ConfigError`.

    ``deterministic`` (``training.deterministic_kernels``) also calls
    :func:`use_deterministic_kernels` for the device.
    """
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device", "is 'cuda' but no CUDA device is available")
    else:
        device = torch.device(name)
    if deterministic:
        use_deterministic_kernels(device)
    return device


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


def use_deterministic_kernels(device: torch.device) -> bool:
    """``training.deterministic_kernels``: make ``device``'s kernels give the same bits on every run.

    On CUDA: ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (unless already set; cuBLAS reads
    it when its first handle is created, so call this before the first matrix
    product), ``torch.use_deterministic_algorithms(True)`` (an operation without a
    deterministic kernel then raises ``RuntimeError`` naming it) and cuDNN without
    autotuning. Process-wide. On the CPU nothing changes: its kernels are
    deterministic for a fixed number of threads.

    Returns:
        Whether anything was set (False on the CPU).
    """
    if device.type != "cuda":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    return True
