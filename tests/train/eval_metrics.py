"""Evaluation callbacks for the tests (``training.eval_callback = "tests.train.eval_metrics:..."``)."""

from __future__ import annotations

import torch


def token_accuracy(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Share of the loss-masked tokens whose highest logit is the label."""
    mask = batch["loss_mask"] > 0
    hits = (logits.argmax(-1) == batch["labels"]) & mask
    return {"accuracy": hits.sum().float() / mask.sum().clamp(min=1)}


def returns_a_list(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> list[float]:
    """A broken callback: not a dict."""
    return [1.0]


NOT_CALLABLE = 3
