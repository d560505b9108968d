"""The device's kernels and process-group backend, checked before a run creates anything.

- ``training.attention_backend`` (``flash``, ``efficient``, ``cudnn``, ``math``)
  restricts PyTorch's scaled-dot-product attention to one kernel. Whether that
  kernel exists for the run depends on the device, the dtype, the head size and the
  kind of mask the model uses (``efficient`` and ``cudnn`` have no CPU kernel at
  all; ``flash`` on CUDA takes no arbitrary mask). :func:`check_attention_backend`
  runs the attention the model will run (causal, a boolean padding / document mask,
  a float bias, or none) on a tiny tensor of the run's device, dtype and head size,
  forward and backward, under that restriction: a kernel PyTorch cannot pick is
  refused naming the option, instead of a ``No viable backend`` traceback in the
  first step after the run directory was made.
- ``parallel.backend = "nccl"`` needs CUDA devices: on the CPU it is refused
  (:func:`check_process_group_backend`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from epochal.model.config import ConfigError, ModelConfig

__all__ = ["attention_kinds", "check_attention_backend", "check_process_group_backend"]


def attention_kinds(config: Any, model_config: ModelConfig) -> list[str]:
    """The masks the model's attention calls use: ``causal``, ``bool``, ``float`` or ``none``."""
    m, d = model_config, config.data
    if m.type == "t5":  # encoder padding, decoder causal, a relative bias if any
        return ["bool", "causal", *(["float"] if m.position_embedding_type == "relative" else [])]
    if m.position_embedding_type == "alibi":
        return ["float"]
    if m.is_encoder:
        return ["none"] if d.pack_sequences else ["bool"]
    return ["bool"] if config.per_document_attention else ["causal"]


def _probe(kind: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> None:
    q = torch.randn(1, 2, 8, head_dim, device=device, dtype=dtype, requires_grad=True)
    kwargs: dict[str, Any] = {}
    if kind == "causal":
        kwargs["is_causal"] = True
    elif kind == "bool":
        kwargs["attn_mask"] = torch.ones(8, 8, dtype=torch.bool, device=device).tril()
    elif kind == "float":
        kwargs["attn_mask"] = torch.zeros(8, 8, dtype=dtype, device=device)
    F.scaled_dot_product_attention(q, q, q, **kwargs).sum().backward()


def check_attention_backend(config: Any, model_config: ModelConfig, device: torch.device) -> None:
    """Refuse a ``training.attention_backend`` that has no kernel for this run (module docstring).

    Raises:
        ConfigError: naming ``training.attention_backend``, the device, dtype, head size,
            mask kind and PyTorch's reason.
    """
    from epochal.train.device import sdpa_backends

    t = config.training
    backends = sdpa_backends(t.attention_backend)
    if backends is None:
        return
    from torch.nn.attention import sdpa_kernel

    dtype = torch.bfloat16 if t.bf16 else torch.float16 if t.fp16 else torch.float32
    for kind in attention_kinds(config, model_config):
        try:
            with sdpa_kernel(backends):
                _probe(kind, device, dtype, model_config.head_dim)
        except RuntimeError as exc:
            text = str(exc).strip()
            reason = text.splitlines()[0].rstrip(".") if text else type(exc).__name__
            raise ConfigError(
                "training.attention_backend",
                f"{t.attention_backend!r} has no kernel for this run on {device.type} "
                f"({str(dtype).removeprefix('torch.')}, head size {model_config.head_dim}, "
                f"{kind} attention mask): {reason}; use 'auto' (PyTorch's choice) or 'math'",
            ) from None


def check_process_group_backend(config: Any, device: torch.device) -> None:
    """Refuse ``parallel.backend = "nccl"`` when the run's device is not CUDA.

    Raises:
        ConfigError: naming ``parallel.backend`` and ``training.device``.
    """
    if config.parallel.backend == "nccl" and device.type != "cuda":
        raise ConfigError(
            "parallel.backend",
            f"'nccl' runs on CUDA devices only, but training.device={config.training.device!r} "
            f"is {device.type}; use 'gloo' or 'auto' (gloo on the CPU)",
        )
