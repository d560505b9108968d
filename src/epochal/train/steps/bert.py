"""``BertTrainStep``: Megatron's ``pretrain_bert`` forward step and loss (Accelerate's names).

Batches come in either key set:

- Megatron's (:func:`epochal.data.build_bert_datasets`): ``text``, ``types``,
  ``labels`` (-1 where not predicted), ``is_random``, ``loss_mask``, ``padding_mask``;
- BioNeMo's (``MaskedTokenDataset``): ``tokens``, ``labels`` (-100 where not
  predicted), ``loss_mask`` and optionally ``padding_mask`` / ``types``.

Packed micro-batches (``data.pack_sequences``,
:func:`epochal.data.loading.packing.pack_padded_batch`) carry ``cu_seqlens``
besides ``[1, T]`` tensors: :meth:`BertTrainStep.get_batch` then returns it as a
seventh item and the model gets it as ``cu_seqlens=`` (attention within each
sample, positions restarting). The loss is computed the same way: the token mean
over ``loss_mask`` and, with the binary head, one ``is_random`` target per sample.

Loss of a micro-batch: the masked-LM cross-entropy averaged over ``loss_mask``
(``"lm loss"``), plus, when the model has the binary (next-sentence / sentence
order) head, the cross-entropy of its logits against ``is_random``
(``"sop loss"``), as Megatron. Evaluation also reports the masked-token accuracy
(``"mlm accuracy"``, the share of loss-masked tokens whose top prediction is
the label) and ``"mlm ppl"`` (``exp`` of the mean ``lm loss``), which is also the
evaluation's perplexity (the sentence-order loss is not a token cross-entropy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from epochal._masked_mean import masked_mean
from epochal.data.loading.packing import PACKED_KEY
from epochal.train.steps.base import TrainStep
from epochal.train.steps.registry import register_train_step

__all__ = ["BertTrainStep"]


@register_train_step("bert", "esm")
class BertTrainStep(TrainStep):
    """The BERT / ESM masked-LM train step; subclass it to change the batch, forward or loss."""

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """``(tokens, types, sentence_order, loss_mask, lm_labels, padding_mask)`` (Megatron's order).

        ``tokens``/``lm_labels`` int64 ``[b, s]`` (labels < 0 where not predicted),
        ``loss_mask`` float ``[b, s]``; ``types`` int64 ``[b, s]``,
        ``sentence_order`` int64 ``[b]`` and ``padding_mask`` int64 ``[b, s]``
        (1 = real token) or None when the data has none. A packed batch adds a
        seventh item, ``cu_seqlens`` (int32 ``[n + 1]``; the tensors are then
        ``[1, T]`` and ``sentence_order`` ``[n]``).
        """
        batch = next(data_iterator)
        tokens = batch["text"] if "text" in batch else batch["tokens"]
        types = batch.get("types")
        order = batch.get("is_random")
        padding = batch.get("padding_mask")
        out = (
            tokens.long(),
            None if types is None else types.long(),
            None if order is None else order.long().reshape(-1),
            batch["loss_mask"].float(),
            batch["labels"].long(),
            None if padding is None else padding.long(),
        )
        if PACKED_KEY in batch:
            return (*out, batch[PACKED_KEY])
        return out

    def loss_func(
        self,
        loss_mask: torch.Tensor,
        sentence_order: torch.Tensor | None,
        output_tensor: Any,
        hits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Masked-LM token mean (+ binary-head cross-entropy) of one micro-batch.

        Args:
            loss_mask: float ``[b, s]``.
            sentence_order: int64 ``[b]`` targets of the binary head (or None).
            output_tensor: per-token losses ``[b, s]``, or ``(losses, binary_logits [b, 2])``.
            hits: bool ``[b, s]`` top-1 correctness (evaluation), or None.
        """
        losses, binary_logits = (
            output_tensor if isinstance(output_tensor, tuple) else (output_tensor, None)
        )
        mask = loss_mask.reshape(-1).float()
        lm_loss = masked_mean(losses.float().reshape(-1), mask)
        logged: dict[str, Any] = {"lm loss": lm_loss.detach()}
        loss = lm_loss
        if binary_logits is not None:
            if sentence_order is None:
                raise ValueError(
                    "the model has a binary head but the batch has no 'is_random' targets"
                )
            sop_loss = F.cross_entropy(
                binary_logits.reshape(-1, 2).float(), sentence_order.reshape(-1), ignore_index=-1
            )
            loss = lm_loss + sop_loss
            logged["sop loss"] = sop_loss.detach()
        if hits is not None:
            logged["mlm accuracy"] = masked_mean(hits.reshape(-1).float(), mask)
        return loss, logged

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[Any, Callable[..., Any]]:
        """Per-token MLM losses (and binary logits) of the next micro-batch, and the loss function.

        In evaluation (``model.training`` is False) the logits are also scored for
        top-1 accuracy on the loss-masked tokens.
        """
        tokens, types, order, loss_mask, labels, padding, *packed = self.get_batch(data_iterator)
        if not self.uses_token_types():
            types = None  # Megatron: token types only with the binary head's two segments
        # Labels < 0 mark tokens that are not predicted (loss_mask 0 there).
        labels = labels.clamp(min=0)
        kwargs = {"cu_seqlens": packed[0]} if packed else {}
        if model.training:
            output = model(tokens, types, padding, labels=labels, **kwargs)
            return output, partial(self.loss_func, loss_mask, order)
        logits = model(tokens, types, padding, **kwargs)
        rest: tuple[Any, ...] = ()
        if isinstance(logits, tuple):
            logits, *extra = logits
            rest = tuple(extra)
        losses = model.per_token_loss(logits, labels)
        hits = model.prediction_hits(logits, labels)
        output = (losses, *rest) if rest else losses
        return output, partial(self.loss_func, loss_mask, order, hits=hits)

    every_stage_reads_batches = True  # the padding mask masks attention on every stage

    def input_ids(self, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The first pipeline stage's ids: Megatron's ``text`` or BioNeMo's ``tokens`` (:meth:`get_batch`)."""
        return self.get_batch(iter([micro_batch]))[0]

    def stage_kwargs(self, micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``token_types`` (first stage; ignored by later ones) and ``padding_mask`` (every stage)."""
        _, types, _, _, _, padding, *_ = self.get_batch(iter([micro_batch]))
        out = {}
        if types is not None and self.uses_token_types():
            out["token_types"] = types
        if padding is not None:
            out["padding_mask"] = padding
        return out

    def uses_token_types(self) -> bool:
        """Whether the model has token types (``model.num_tokentypes > 0``; True without a config)."""
        model = getattr(self.args, "model", None)
        return getattr(model, "num_tokentypes", 1) > 0

    def perplexity(self, loss: float, summary: dict[str, float]) -> float | None:
        """``exp`` of the masked-LM loss only (the loss also holds the binary head's)."""
        return summary.get("mlm ppl", super().perplexity(loss, summary))

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """Add ``"mlm ppl"`` = ``exp(lm loss)`` to an evaluation's averaged values."""
        out = dict(logged)
        if "lm loss" in out:
            out["mlm ppl"] = math.exp(min(out["lm loss"], 700.0))
        return out
