"""The fine-tuning loss: cross-entropy summed over the loss tokens, divided by their number.

A row's ``loss_mask[i]`` (from :mod:`epochal.data.sft.tokenize`) says token ``i`` is a
target; the model predicts it at position ``i - 1``. :func:`shift_labels` turns a row
into the labels of each *position* (``labels[i] = input_ids[i + 1]`` where
``loss_mask[i + 1]``, else ``-100``; the last position has none), the alignment
Megatron's ``tokens`` / ``labels`` / ``loss_mask`` samples use and the one that
``transformers``' causal-LM loss builds internally (``labels[..., 1:]``).

The loss of a global batch is ``sum(CE over its loss tokens) / number of loss tokens``
(``transformers``' ``num_items_in_batch`` semantics): pass the global count as
``num_items_in_batch`` to :func:`sft_loss` on every micro-batch and rank, and the sum
of those losses is the global token mean, whatever the split into micro-batches. A
validation loss is the same token mean over all loss tokens of the validation set.
"""

from __future__ import annotations

import numpy as np
import torch

from epochal._masked_mean import mean_from_sum

__all__ = ["IGNORE_INDEX", "count_loss_tokens", "shift_labels", "sft_loss", "sft_loss_sum"]

#: the label of a position without a target (``transformers``' and PyTorch's ignore index)
IGNORE_INDEX = -100


def shift_labels(input_ids: np.ndarray | torch.Tensor, loss_mask: np.ndarray | torch.Tensor):
    """Per-position labels of rows: the next token where it is a target, else ``-100``.

    Args:
        input_ids: int ``[..., L]``.
        loss_mask: bool (or 0/1) ``[..., L]``, the targets among ``input_ids``.

    Returns:
        int64 ``[..., L]`` of the same kind (NumPy or torch) as ``input_ids``;
        ``labels[..., -1] == -100``.

    Raises:
        ValueError: the shapes differ.
    """
    if tuple(input_ids.shape) != tuple(loss_mask.shape):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and loss_mask {tuple(loss_mask.shape)} differ"
        )
    if isinstance(input_ids, torch.Tensor):
        mask = torch.as_tensor(loss_mask, device=input_ids.device).bool()
        labels = torch.full(
            input_ids.shape, IGNORE_INDEX, dtype=torch.long, device=input_ids.device
        )
        nxt = input_ids[..., 1:].long()
        labels[..., :-1] = torch.where(mask[..., 1:], nxt, torch.full_like(nxt, IGNORE_INDEX))
        return labels
    ids = np.asarray(input_ids)
    mask = np.asarray(loss_mask).astype(bool)
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    labels[..., :-1] = np.where(mask[..., 1:], ids[..., 1:], IGNORE_INDEX)
    return labels


def count_loss_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Positions with a target (``labels != -100``), int64 scalar."""
    return (labels != IGNORE_INDEX).sum()


def sft_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy over the positions with a target, float32 scalar.

    Args:
        logits: ``[..., L, V]`` (computed in float32).
        labels: int ``[..., L]`` from :func:`shift_labels` (``-100`` = no target).

    Raises:
        ValueError: the leading shapes differ.
    """
    if tuple(logits.shape[:-1]) != tuple(labels.shape):
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1).to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def sft_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-mean cross-entropy: :func:`sft_loss_sum` / ``num_items_in_batch``.

    Args:
        logits: ``[..., L, V]``.
        labels: int ``[..., L]`` (``-100`` = no target).
        num_items_in_batch: the loss tokens of the whole global batch (all
            micro-batches and ranks); default: this batch's own count.

    Returns:
        float32 scalar; 0 when there is no loss token.
    """
    total = sft_loss_sum(logits, labels)
    count = count_loss_tokens(labels) if num_items_in_batch is None else num_items_in_batch
    count = torch.as_tensor(count, device=total.device, dtype=total.dtype)
    return mean_from_sum(total, count)
