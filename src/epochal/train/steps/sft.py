"""``SFTTrainStep``: the GPT step of a fine-tuning run (``sft.train_file``), its loss a global token mean.

A training step's loss is the sum of the cross-entropy over the loss tokens of the
whole global batch divided by their number: ``transformers``' ``num_items_in_batch``
(the loss TRL's ``SFTTrainer`` trains with) and Megatron-Core's
``calculate_per_token_loss``. The step returns each micro-batch's summed
cross-entropy and its loss tokens (the GPT step's summed form); the trainer counts
the global batch's loss tokens ``N`` from the data before the step (no
communication: every rank knows every sample's count, :attr:`SFTTrainStep.calculate_per_token_loss`)
and its step plan weighs each sum by ``M / N``, ``M`` the micro-batches of the global
batch (:mod:`epochal.parallel.step_plan`), so the step's loss and gradient are
``sum / N`` whatever the split over micro-batches and ranks, and the same numbers
under the exact gradient synchronisation bit for bit. A micro-batch's logged
``lm loss`` averages to the step's loss.

Evaluation (no gradients): each micro-batch also logs its summed cross-entropy and its
loss tokens, and the evaluation's loss is their ratio over the whole validation set
(:meth:`SFTTrainStep.evaluation_loss`): the token mean over every loss token of the
validation rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from epochal.train.steps.gpt import GPTTrainStep

__all__ = ["SFTTrainStep"]

_SUM, _COUNT = "sft loss sum", "sft loss tokens"


class SFTTrainStep(GPTTrainStep):
    """The GPT step with the fine-tuning loss of the module docstring."""

    #: summed losses; the trainer plans a global token mean (the data's loss-token counts)
    calculate_per_token_loss = True

    @property
    def trims_padding(self) -> bool:
        """Whether unpacked micro-batches lose their trailing loss-free columns (:meth:`get_batch`).

        On one pipeline stage without tensor parallelism, ``torch.compile`` or
        ``training.layout_invariant`` (whose bit-exactness across layouts wants every
        micro-batch the same shape); data parallelism is fine.
        """
        config = self.args
        if config is None or not hasattr(config, "training"):
            return False
        t, p = config.training, config.parallel
        return not (
            t.layout_invariant
            or t.compile
            or p.tensor_parallel > 1
            or p.pipeline_parallel > 1
            or getattr(p, "context_parallel", 1) > 1
        )

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """The GPT step's batch; unpacked rows cut after the micro-batch's last loss token.

        One row a sample pads every row to ``data.seq_length``; with
        :attr:`trims_padding` the columns after the last loss token of every row of the
        micro-batch (rounded up to a multiple of 8) are dropped. Under causal attention
        no earlier position sees them and none carries loss, so the loss and gradients
        are those of the full width (up to float rounding) on less compute, as
        ``transformers``' collators pad a batch to its longest row. Packed samples
        (their ``attention_mask``) are left whole.
        """
        batch = super().get_batch(data_iterator)
        tokens, labels, loss_mask, attention_mask, position_ids = batch
        if attention_mask is not None or not self.trims_padding:
            return batch
        columns = torch.nonzero(loss_mask.reshape(-1, loss_mask.shape[-1]).any(0))
        width = int(columns[-1]) + 1 if columns.numel() else 1
        width = min(-(-width // 8) * 8, tokens.shape[-1])
        if width == tokens.shape[-1]:
            return batch
        positions = None if position_ids is None else position_ids[..., :width]
        return tokens[..., :width], labels[..., :width], loss_mask[..., :width], None, positions

    def loss_func(
        self, loss_mask: torch.Tensor, output_tensor: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        """The GPT step's ``(sum, count, logged)``; in an evaluation (no gradients) the sum and
        the count are logged too, for :meth:`eval_summary`."""
        total, count, logged = super().loss_func(loss_mask, output_tensor)
        if not torch.is_grad_enabled():
            logged.update({_SUM: total.detach(), _COUNT: count.detach()})
        return total, count, logged

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """``lm loss``: the token mean over every loss token of the evaluation."""
        out = {k: v for k, v in logged.items() if k not in (_SUM, _COUNT)}
        if float(logged.get(_COUNT, 0.0)) > 0:
            out["lm loss"] = float(logged[_SUM]) / float(logged[_COUNT])
        return out

    def evaluation_loss(self, mean_loss: float, summary: dict[str, float]) -> float:
        """The token mean over every loss token of the evaluation (not a mean of means)."""
        return summary.get("lm loss", mean_loss)
