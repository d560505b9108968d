"""The default per-micro-batch loss of causal language models (Megatron's GPT loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from epochal._masked_mean import masked_mean

__all__ = ["masked_token_mean_loss"]


def masked_token_mean_loss(
    labels: torch.Tensor, logits: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Megatron's GPT loss of one micro-batch: cross-entropy averaged over unmasked tokens.

    Args:
        labels: int64 ``[b, s]`` target ids.
        logits: ``[b, s, V]`` (upcast to float32 here).
        loss_mask: ``[b, s]``, 1.0 where the token counts.

    Returns:
        float32 scalar; 0 if no token counts (a fully padded micro-batch).
    """
    losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
    mask = loss_mask.flatten().to(losses.dtype)
    return masked_mean(losses, mask)
