"""Normalization layers: LayerNorm or RMSNorm, chosen by ``ModelConfig.normalization``.

Both are PyTorch's own modules (``torch.nn.LayerNorm`` with weight and bias,
``torch.nn.RMSNorm`` with a weight only), so tensor/sequence-parallel plans and
``torch.compile`` treat them as usual. Parameter names: ``weight`` (and ``bias``
for LayerNorm); initialization sets weight to 1 and bias to 0.
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.config import ModelConfig

__all__ = ["build_norm", "reset_norm"]


def build_norm(config: ModelConfig, dim: int | None = None) -> nn.Module:
    """Return the norm layer named by ``config.normalization`` over the last ``dim`` channels.

    Args:
        config: the model config (``normalization``, ``norm_epsilon``).
        dim: normalized size; defaults to ``config.hidden_size``.

    Returns:
        ``nn.LayerNorm`` or ``nn.RMSNorm``; input and output ``[..., dim]``.
    """
    size = config.hidden_size if dim is None else dim
    if config.normalization == "RMSNorm":
        return nn.RMSNorm(size, eps=config.norm_epsilon)
    return nn.LayerNorm(size, eps=config.norm_epsilon)


@torch.no_grad()
def reset_norm(norm: nn.Module) -> None:
    """Set a norm's weight to ones and its bias (if any) to zeros, in place."""
    weight = getattr(norm, "weight", None)
    if weight is not None:
        weight.fill_(1.0)
    bias = getattr(norm, "bias", None)
    if bias is not None:
        bias.zero_()
