"""``T5TrainStep``: Megatron's ``pretrain_t5`` forward step and loss (Accelerate's names).

Batches carry Megatron's T5 keys (:func:`epochal.data.build_t5_datasets`):
``text_enc`` / ``text_dec`` (int64 ``[b, s_enc]`` / ``[b, s_dec]``), ``labels``
(``-1`` on padding), ``loss_mask``, ``enc_mask`` / ``dec_mask`` (1 = token, 0 =
padding). The model is called as ``model(text_enc, text_dec, enc_mask, dec_mask,
labels=labels)`` (:class:`~epochal.model.T5Model`'s padding masks; the decoder's
causal mask is the model's own).

Loss of a micro-batch: the decoder's cross-entropy averaged over ``loss_mask``
(``"lm loss"``), as Megatron. Evaluation also reports ``"lm accuracy"`` (the share of
loss-masked tokens whose top prediction is the label) and ``"lm ppl"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from epochal._masked_mean import masked_mean
from epochal.train.steps.base import TrainStep
from epochal.train.steps.registry import register_train_step

__all__ = ["T5TrainStep"]


@register_train_step("t5")
class T5TrainStep(TrainStep):
    """The T5 span-corruption train step; subclass it to change the batch, forward or loss."""

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """``(tokens_enc, tokens_dec, loss_mask, lm_labels, enc_mask, dec_mask)`` (Megatron's order).

        Token ids and labels int64, ``loss_mask`` float, the masks int64 (1 = token).
        """
        batch = next(data_iterator)
        return (
            batch["text_enc"].long(),
            batch["text_dec"].long(),
            batch["loss_mask"].float(),
            batch["labels"].long(),
            batch["enc_mask"].long(),
            batch["dec_mask"].long(),
        )

    def loss_func(
        self, loss_mask: torch.Tensor, output_tensor: torch.Tensor, hits: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Token mean of the per-token losses ``[b, s_dec]`` over ``loss_mask``.

        Args:
            loss_mask: float ``[b, s_dec]``.
            output_tensor: float32 per-token losses ``[b, s_dec]``.
            hits: bool ``[b, s_dec]`` top-1 correctness (evaluation), or None.
        """
        mask = loss_mask.reshape(-1).float()
        lm_loss = masked_mean(output_tensor.float().reshape(-1), mask)
        logged: dict[str, Any] = {"lm loss": lm_loss.detach()}
        if hits is not None:
            logged["lm accuracy"] = masked_mean(hits.reshape(-1).float(), mask)
        return lm_loss, logged

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[Any, Callable[..., Any]]:
        """Per-token decoder losses of the next micro-batch, and the loss function."""
        tokens_enc, tokens_dec, loss_mask, labels, enc_mask, dec_mask = self.get_batch(
            data_iterator
        )
        labels = labels.clamp(min=0)  # -1 marks padding (loss_mask 0 there)
        if model.training:
            output = model(tokens_enc, tokens_dec, enc_mask, dec_mask, labels=labels)
            return output, partial(self.loss_func, loss_mask)
        logits = model(tokens_enc, tokens_dec, enc_mask, dec_mask)
        losses = model.per_token_loss(logits, labels)
        hits = model.prediction_hits(logits, labels)
        return losses, partial(self.loss_func, loss_mask, hits=hits)

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """Add ``"lm ppl"`` = ``exp(lm loss)`` to an evaluation's averaged values."""
        out = dict(logged)
        if "lm loss" in out:
            out["lm ppl"] = math.exp(min(out["lm loss"], 700.0))
        return out
