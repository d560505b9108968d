"""The masked mean of per-token (or per-sample) losses, written once.

Every loss that averages over the entries a mask keeps goes through these three
functions, so that the arithmetic order (product, sum, clamped count, one division)
is the same everywhere: ``sum(values * mask) / max(sum(mask), 1)``. The module
imports nothing from the package, so data, model, parallel and train code can all
use it.
"""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_sum_and_count", "mean_from_sum"]


def masked_sum_and_count(
    values: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of ``values`` where ``mask`` keeps them, and the number kept.

    Args:
        values: float tensor, any shape (per-token losses, hits as floats, ...).
        mask: a tensor broadcastable to ``values``: float weights (1.0 keeps an
            entry, 0.0 drops it) or bool.

    Returns:
        ``(sum(values * mask), sum(mask))``: two scalars; the count has the mask's
        summed dtype (float for a float mask, int64 for a bool one).
    """
    return (values * mask).sum(), mask.sum()


def mean_from_sum(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``total / max(count, 1)``: a mean that is 0 when nothing was counted.

    Args:
        total: scalar sum (as from :func:`masked_sum_and_count`).
        count: scalar count of the summed entries.

    Returns:
        float scalar.
    """
    return total / count.clamp(min=1.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over the entries ``mask`` keeps (0 when it keeps none).

    Args:
        values: float tensor, any shape.
        mask: float weights or bool, broadcastable to ``values``.

    Returns:
        float scalar ``sum(values * mask) / max(sum(mask), 1)``.
    """
    return mean_from_sum(*masked_sum_and_count(values, mask))
