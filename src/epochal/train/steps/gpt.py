"""``GPTTrainStep``: Megatron's ``pretrain_gpt`` forward step and loss (Accelerate's names).

The loss of a micro-batch is the cross-entropy averaged over the tokens where
``loss_mask`` is 1 (``sum(ce * loss_mask) / max(sum(loss_mask), 1)``), logged as
``"lm loss"``. With :attr:`~epochal.train.steps.TrainStep.calculate_per_token_loss`
the step returns the sum and the count instead and the step plan divides
(:mod:`epochal.parallel.step_plan`: by a global token count where the trainer has one,
as for fine-tuning rows and ``num_items_in_batch``). :class:`LossFnStep` runs a plain ``loss_fn(labels, logits, loss_mask)``
through the same contract (the trainer's ``loss_fn=`` argument).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from epochal._masked_mean import masked_sum_and_count, mean_from_sum
from epochal.train.steps.base import TrainStep
from epochal.train.steps.registry import register_train_step

__all__ = ["GPTTrainStep", "LossFnStep"]


@register_train_step("gpt")
class GPTTrainStep(TrainStep):
    """The GPT train step; subclass it to change the batch, the forward or the loss."""

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """``(tokens, labels, loss_mask, attention_mask, position_ids)`` of the next micro-batch.

        ``tokens``/``labels`` int64 ``[b, s]``, ``loss_mask`` float ``[b, s]``;
        ``attention_mask`` / ``position_ids`` are None unless the data resets them
        per document (``data.reset_attention_mask`` / ``data.reset_position_ids``).
        """
        batch = next(data_iterator)
        return (
            batch["tokens"],
            batch["labels"],
            batch["loss_mask"],
            batch.get("attention_mask"),
            batch.get("position_ids"),
        )

    def loss_func(self, loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[Any, ...]:
        """The per-token losses ``output_tensor`` ``[b, s]`` under ``loss_mask``: their token mean
        ``(loss, {"lm loss": loss})``, or with :attr:`calculate_per_token_loss` their sum and
        count ``(sum, count, {})`` (the step plan divides and logs ``lm loss``,
        :mod:`epochal.parallel.step_plan`)."""
        losses = output_tensor.float()
        mask = loss_mask.reshape(-1).to(losses.dtype)
        total, count = masked_sum_and_count(losses.reshape(-1), mask)
        if self.calculate_per_token_loss:
            return total, count, {}
        loss = mean_from_sum(total, count)
        return loss, {"lm loss": loss.detach()}

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[torch.Tensor, Callable[..., Any]]:
        """Per-token losses of the next micro-batch and the loss function that reduces them."""
        tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
        output_tensor = model(tokens, position_ids, attention_mask, labels=labels)
        return output_tensor, partial(self.loss_func, loss_mask)

    def stage_kwargs(self, micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-document ``position_ids`` / ``attention_mask`` when the batch has them."""
        return {k: micro_batch[k] for k in ("position_ids", "attention_mask") if k in micro_batch}


class LossFnStep(GPTTrainStep):
    """A GPT step whose loss is ``loss_fn(labels, logits, loss_mask) -> scalar``.

    ``logits`` are ``[b, s, padded_vocab]`` (gathered over the vocabulary under
    tensor parallelism: the trainer turns the vocabulary-parallel loss off).
    """

    def __init__(self, loss_fn: Callable[..., torch.Tensor], args: Any = None) -> None:
        super().__init__(args)
        self.custom_loss = loss_fn

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[torch.Tensor, Callable[..., Any]]:
        """The logits of the next micro-batch and the custom loss bound to its labels/mask."""
        tokens, labels, loss_mask, attention_mask, position_ids = self.get_batch(data_iterator)
        logits = model(tokens, position_ids, attention_mask)
        return logits, partial(self._custom_loss_func, labels, loss_mask)

    def _custom_loss_func(
        self, labels: torch.Tensor, loss_mask: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        loss = self.custom_loss(labels, logits, loss_mask)
        return loss, {"lm loss": loss.detach()}
