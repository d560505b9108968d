"""``SFTTrainStep``: the GPT step of a fine-tuning run (``sft.train_file``), its loss a global token mean.

A training step's loss is the sum of the cross-entropy over the loss tokens of the
whole global batch divided by their number: ``transformers``' ``num_items_in_batch``
(the loss TRL's ``SFTTrainer`` trains with) and Megatron-Core's
``calculate_per_token_loss``. Before each step the trainer counts the global batch's
loss tokens ``N`` from the data (no communication: every rank knows every sample's
count) and sets :attr:`SFTTrainStep.summed_loss_weight` to ``M / N``, ``M`` the micro-batches
of the global batch (all data-parallel ranks). Each micro-batch's loss is then its
summed cross-entropy times ``M / N``; the trainer divides it by ``M`` (its micro-batches
times the data-parallel averaging of the gradients), so the step's loss and gradient
are ``sum / N`` whatever the split over micro-batches and ranks, and the same numbers
under ``training.layout_invariant`` bit for bit. A micro-batch's logged ``lm loss``
averages to the step's loss.

Evaluation (no :attr:`~SFTTrainStep.summed_loss_weight`): each micro-batch logs its summed
cross-entropy and its loss tokens, and the evaluation's loss is their ratio over the
whole validation set (:meth:`SFTTrainStep.evaluation_loss`): the token mean over
every loss token of the validation rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from epochal._masked_mean import masked_sum_and_count, mean_from_sum
from epochal.train.steps.gpt import GPTTrainStep

__all__ = ["SFTTrainStep", "token_mean_step"]

_SUM, _COUNT = "sft loss sum", "sft loss tokens"


class SFTTrainStep(GPTTrainStep):
    """The GPT step with the fine-tuning loss of the module docstring.

    Attributes:
        summed_loss_weight: during a training step, the factor a micro-batch's summed
            cross-entropy is multiplied by: (micro-batches of the global batch) / (its
            loss tokens), set by the trainer; None otherwise (evaluation). Not a loss
            scale: the fp16 scaler's scale is applied by the trainer on top.
    """

    summed_loss_weight: float | None = None

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
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Summed cross-entropy times :attr:`summed_loss_weight` (training), else the token mean."""
        losses = output_tensor.float()
        mask = loss_mask.reshape(-1).to(losses.dtype)
        total, count = masked_sum_and_count(losses.reshape(-1), mask)
        if self.summed_loss_weight is not None:
            loss = total * self.summed_loss_weight
            return loss, {"lm loss": loss.detach()}
        loss = mean_from_sum(total, count)
        return loss, {"lm loss": loss.detach(), _SUM: total.detach(), _COUNT: count.detach()}

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """``lm loss``: the token mean over every loss token of the evaluation."""
        out = {k: v for k, v in logged.items() if k not in (_SUM, _COUNT)}
        if float(logged.get(_COUNT, 0.0)) > 0:
            out["lm loss"] = float(logged[_SUM]) / float(logged[_COUNT])
        return out

    def evaluation_loss(self, mean_loss: float, summary: dict[str, float]) -> float:
        """The token mean over every loss token of the evaluation (not a mean of means)."""
        return summary.get("lm loss", mean_loss)


@contextlib.contextmanager
def token_mean_step(trainer: Any, num_microbatches: int) -> Iterator[None]:
    """Around one training step: set :attr:`SFTTrainStep.summed_loss_weight` (module docstring).

    ``trainer`` is the :class:`~epochal.train.Trainer` (its step, data and
    data-parallel size); the global batch is the ``num_microbatches x micro_batch_size
    x dp`` samples from the train loader's ``consumed_samples``. Nothing happens for
    another step or data that does not count its loss tokens.
    """
    step, counter = trainer.train_step_handler, getattr(trainer.data, "loss_tokens", None)
    if counter is None or not isinstance(step, SFTTrainStep):
        yield
        return
    dp = trainer.data_parallel_info()["dp_size"]
    samples = num_microbatches * trainer.config.training.micro_batch_size * dp
    tokens = counter(trainer.data.train_loader.consumed_samples, samples)
    step.summed_loss_weight = num_microbatches * dp / max(tokens, 1)
    try:
        yield
    finally:
        step.summed_loss_weight = None
