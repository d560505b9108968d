"""The train step of Hugging Face's classifier heads (``model.head`` ``"pooled_classifier"`` /
``"token_classifier"``, :class:`~epochal.model.heads.ClassifierHead`), with transformers' loss.

Micro-batches: ``tokens`` int64 ``[b, s]``, ``padding_mask`` ``[b, s]`` (1 = a real
token), ``types`` (BERT's token types, optional), ``residue_mask`` ``[b, s]`` (the
pooled head: 1 at the one position each sequence is classified by) and ``labels``.

The loss is the one transformers computes (``loss_utils``'
``ForSequenceClassificationLoss`` / ``ForTokenClassification``), by
:attr:`ClassifierStep.problem_type`:

- ``"regression"``: MSE of the logits and the float labels (``num_labels == 1``:
  both flattened);
- ``"single_label_classification"``: cross-entropy of ``[-1, num_labels]`` logits and
  the int64 labels, labels -100 not scored (mean over the scored ones);
- ``"multi_label_classification"``: ``BCEWithLogits`` of the logits and float labels
  ``[b, num_labels]``;
- the token head: cross-entropy over every position, -100 not scored.

A micro-batch's loss is its mean, as transformers'; the step averages the micro-batches
(and data-parallel ranks), so the same global batch in one process gives the same
loss with as many micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from epochal.train.steps.base import TrainStep
from epochal.train.steps.registry import register_train_step

__all__ = ["PROBLEM_TYPES", "ClassifierStep", "classifier_loss"]

PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def classifier_loss(
    logits: torch.Tensor, labels: torch.Tensor, problem_type: str, *, token: bool = False
) -> torch.Tensor:
    """transformers' loss of ``logits`` (``[b, n]``, token head ``[b, s, n]``) and ``labels``.

    Raises:
        ValueError: an unknown ``problem_type``.
    """
    n = logits.shape[-1]
    logits = logits.float()
    if token or problem_type == "single_label_classification":
        return F.cross_entropy(logits.reshape(-1, n), labels.long().reshape(-1), ignore_index=-100)
    if problem_type == "regression":
        if n == 1:
            return F.mse_loss(logits.reshape(-1), labels.float().reshape(-1))
        return F.mse_loss(logits, labels.float().reshape(logits.shape))
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits, labels.float().reshape(logits.shape))
    raise ValueError(f"problem_type must be one of {PROBLEM_TYPES}, got {problem_type!r}")


@register_train_step("pooled_classifier", "token_classifier")
class ClassifierStep(TrainStep):
    """transformers' classification loss of a classifier head (see the module docstring)."""

    every_stage_reads_batches = True  # the masks reach every pipeline stage

    #: how the pooled head's loss reads its labels (set by whoever feeds the batches)
    problem_type: str = "single_label_classification"

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """``(tokens, types or None, padding_mask, residue_mask, labels)`` of the next micro-batch."""
        batch = next(data_iterator)
        tokens = batch["tokens"].long()
        padding = batch.get("padding_mask")
        padding = torch.ones_like(tokens) if padding is None else padding.long()
        residue = batch.get("residue_mask")
        residue = padding if residue is None else residue
        types = batch.get("types")
        return tokens, None if types is None else types.long(), padding, residue, batch["labels"]

    def _is_gpt(self) -> bool:
        return getattr(getattr(self.args, "model", None), "type", "bert") == "gpt"

    def _token_head(self) -> bool:
        return getattr(getattr(self.args, "model", None), "head", "") == "token_classifier"

    def stage_kwargs(self, micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What every pipeline stage takes: the head's positions (and BERT's masks, types)."""
        _, types, padding, residue, _ = self.get_batch(iter([micro_batch]))
        out = {"residue_mask": residue}
        if not self._is_gpt():
            out["padding_mask"] = padding
            if types is not None:
                out["token_types"] = types
        return out

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[Any, Callable[..., Any]]:
        """The head's logits of the next micro-batch and the loss function over its labels.

        GPT models are causal: the padding (on the right) is invisible to the real tokens.
        """
        tokens, types, padding, residue, labels = self.get_batch(data_iterator)
        if self._is_gpt():
            output = model(tokens, residue_mask=residue)
        else:
            output = model(tokens, types, padding, residue_mask=residue)
        return output, partial(self.loss_func, labels)

    def loss_func(
        self, labels: torch.Tensor, output: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(loss, {"loss": loss})`` (:func:`classifier_loss`)."""
        loss = classifier_loss(output, labels, self.problem_type, token=self._token_head())
        return loss, {"loss": loss.detach()}

    def perplexity(self, loss: float, summary: dict[str, float]) -> float | None:
        """None: a classifier's loss is not a token cross-entropy over a vocabulary."""
        return None
