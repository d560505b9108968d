"""Train steps of the fine-tuning heads (``model.head``), one registered per head kind.

Batches (:mod:`epochal.data.datasets.labelled`): ``tokens`` int64 ``[b, s]``,
``padding_mask`` ``[b, s]`` (1 = a real token), ``residue_mask`` ``[b, s]`` (1 = a
residue: not ``<cls>``/``<eos>``/padding) and ``labels``:

- ``sequence_regression``: float ``[b, num_labels]``; loss MSE; evaluation logs
  ``mse``, ``pearson`` and ``spearman`` (over the whole evaluation);
- ``sequence_classification``: int64 ``[b]``; ``residue_classification``: int64
  ``[b, s]``; negative labels are not scored (-100: not a residue / padding, -2: a
  class training never saw, counted in ``unseen labels``); loss cross-entropy over
  the scored labels; evaluation logs ``accuracy`` and ``accuracy <class>`` (named
  by the run's ``label_vocab.json``; ``accuracy class k`` without one).

The metrics are exact under every layout: sums are logged and divided after the
trainer's averaging (:mod:`.head_metrics`), and Spearman's pairs are gathered over
the data-parallel ranks and sent from the last pipeline stage to every rank. An
evaluation's loss is the one over all its scored targets (``ce loss`` / ``mse``,
:meth:`~epochal.train.steps.base.TrainStep.evaluation_loss`), and rows without a
target (label -100, or a NaN regression target: the filler completing the last
global batch, :mod:`epochal.train.inputs.eval_rows`) count nowhere. No perplexity.

Packed micro-batches (``data.pack_sequences``): the model gets ``cu_seqlens``; the
sequence heads' labels are per protein (``[n]`` / ``[n, num_labels]``), the residue
head's per token of the packed row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from epochal.data.loading.packing import PACKED_KEY
from epochal.train.inputs.eval_rows import IGNORE_INDEX
from epochal.train.steps.base import TrainStep
from epochal.train.steps.head_metrics import (
    accuracy_from_counts,
    classification_counts,
    masked_cross_entropy,
    masked_mse,
    mse,
    mse_from_sums,
    pearson_from_sums,
    regression_sums,
    spearman,
)
from epochal.train.steps.reduce import gather_across_data_parallel_groups
from epochal.train.steps.registry import register_train_step

__all__ = [
    "HeadTrainStep",
    "ResidueClassificationStep",
    "SequenceClassificationStep",
    "SequenceRegressionStep",
]


class HeadTrainStep(TrainStep):
    """Shared batch handling and forward of the fine-tuning heads (subclasses: the loss)."""

    every_stage_reads_batches = True  # padding / residue masks reach every pipeline stage

    def get_batch(self, data_iterator: Iterator[dict[str, torch.Tensor]]) -> tuple[Any, ...]:
        """``(tokens, padding_mask, residue_mask, labels)`` of the next micro-batch.

        A packed micro-batch (``data.pack_sequences``) adds a fifth item, ``cu_seqlens``
        (int32 ``[n + 1]``; the tensors are then ``[1, T]``, per-sequence labels ``[n, ...]``).
        """
        batch = next(data_iterator)
        tokens = batch["tokens"].long()
        padding = batch.get("padding_mask")
        padding = torch.ones_like(tokens) if padding is None else padding.long()
        residue = batch.get("residue_mask")
        residue = padding if residue is None else residue.long()
        out = (tokens, padding, residue, batch["labels"])
        return (*out, batch[PACKED_KEY]) if PACKED_KEY in batch else out

    def stage_kwargs(self, micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``padding_mask`` and ``residue_mask`` for every pipeline stage."""
        _, padding, residue, *_ = self.get_batch(iter([micro_batch]))
        return {"padding_mask": padding, "residue_mask": residue}

    def forward_step(
        self, data_iterator: Iterator[dict[str, torch.Tensor]], model: Any
    ) -> tuple[Any, Callable[..., Any]]:
        """The head's predictions of the next micro-batch and the loss function over its labels.

        Packed micro-batches reach the model with their ``cu_seqlens`` (attention within
        each protein, positions restarting, the sequence head pooling each protein).
        """
        tokens, padding, residue, labels, *packed = self.get_batch(data_iterator)
        kwargs = {"cu_seqlens": packed[0]} if packed else {}
        output = model(tokens, None, padding, residue_mask=residue, **kwargs)
        return output, partial(self.loss_func, self.targets(labels, residue), not model.training)

    def targets(self, labels: torch.Tensor, residue_mask: torch.Tensor) -> torch.Tensor:
        """The labels the loss sees (default: as the batch has them)."""
        return labels

    def num_labels(self) -> int:
        """``model.num_labels`` of the configuration (1 without one)."""
        return int(getattr(getattr(self.args, "model", None), "num_labels", 1))

    def perplexity(self, loss: float, summary: dict[str, float]) -> float | None:
        """None: a head's loss is not a token cross-entropy over a vocabulary."""
        return None


@register_train_step("sequence_regression")
class SequenceRegressionStep(HeadTrainStep):
    """MSE of the sequence head's values; evaluation: MSE, Pearson, Spearman.

    A NaN target is not scored (an evaluation's filler row, a packed row's tail).
    """

    per_sample_keys = ("labels",)

    def __init__(self, args: Any = None, **kwargs: Any) -> None:
        super().__init__(args, **kwargs)
        self._pairs: list[torch.Tensor] = []

    def loss_func(
        self, labels: torch.Tensor, evaluating: bool, output: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(mse, logged)``; ``labels`` float ``[b, num_labels]``, ``output`` ``[b, num_labels]``."""
        target = labels.float().reshape(output.shape)
        scored = ~torch.isnan(target)
        loss = mse(output, target) if bool(scored.all()) else masked_mse(output, target, scored)
        logged: dict[str, Any] = {"mse loss": loss.detach()}
        if evaluating:
            x, y = output.detach()[scored], target[scored]
            logged.update(regression_sums(x, y))
            self._pairs.append(torch.stack([x.double(), y.double()], 1))
        return loss, logged

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """``mse``, ``pearson`` and ``spearman`` of the whole evaluation (over its scored rows)."""
        out = {k: v for k, v in logged.items() if not k.startswith("reg ")}
        if "reg n" in logged:
            out.pop("mse loss", None)
            out["mse"] = mse_from_sums(logged)
            out["pearson"] = pearson_from_sums(logged)
        pairs = self._pairs
        self._pairs = []
        local = torch.cat(pairs) if pairs else torch.zeros((0, 2), dtype=torch.float64)
        rho = _spearman_everywhere(local)
        if rho is not None:
            out["spearman"] = rho
        return out

    def evaluation_loss(self, mean_loss: float, summary: dict[str, float]) -> float:
        """The MSE over every scored target of the evaluation (not a mean of micro-batch means)."""
        return summary.get("mse", mean_loss)


class _ClassificationStep(HeadTrainStep):
    """Cross-entropy over the scored labels; evaluation: accuracy overall and per class."""

    def loss_func(
        self, labels: torch.Tensor, evaluating: bool, output: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(cross-entropy, logged)``; ``output`` ``[..., num_labels]``, ``labels`` int64 ``[...]``."""
        labels = labels.long().reshape(output.shape[:-1])
        loss = masked_cross_entropy(output, labels)
        logged: dict[str, Any] = {"ce loss": loss.detach()}
        if evaluating:
            counts = classification_counts(output, labels, output.shape[-1])
            counts["cls ce sum"] = loss.detach().double().cpu() * counts["cls count"]
            logged.update(counts)
        return loss, logged

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """``ce loss``, ``accuracy``, ``accuracy <class>`` (and ``unseen labels``) of the whole evaluation.

        ``ce loss`` is the cross-entropy over every scored label of the evaluation.
        Classes are named by the run's ``label_vocab.json`` when there is one, else by index.
        """
        out = {k: v for k, v in logged.items() if not k.startswith("cls ")}
        if float(logged.get("cls count", 0.0)) > 0:
            out["ce loss"] = float(logged["cls ce sum"]) / float(logged["cls count"])
        names = self.class_names()
        for key, value in accuracy_from_counts(logged, self.num_labels()).items():
            if key.startswith("accuracy class ") and names is not None:
                key = f"accuracy {names[int(key.rsplit(' ', 1)[1])]}"
            out[key] = value
        return out

    def evaluation_loss(self, mean_loss: float, summary: dict[str, float]) -> float:
        """The cross-entropy over every scored label of the evaluation."""
        return summary.get("ce loss", mean_loss)

    def class_names(self) -> list[str] | None:
        """The class names of the run (``<run_dir>/label_vocab.json``), or None."""
        run_dir = getattr(self.args, "run_dir", None)
        path = Path(run_dir) / "label_vocab.json" if run_dir else None
        if path is None or not path.is_file():
            return None
        names = json.loads(path.read_text()).get("labels")
        return names if isinstance(names, list) and len(names) == self.num_labels() else None


@register_train_step("sequence_classification")
class SequenceClassificationStep(_ClassificationStep):
    """One class per sequence (``labels`` ``[b]``)."""

    per_sample_keys = ("labels",)


@register_train_step("residue_classification")
class ResidueClassificationStep(_ClassificationStep):
    """One class per residue (``labels`` ``[b, s]``, -100 where not a residue)."""

    def targets(self, labels: torch.Tensor, residue_mask: torch.Tensor) -> torch.Tensor:
        """``labels`` with -100 wherever ``residue_mask`` is 0 (also a packed row's padded tail)."""
        return labels.masked_fill(residue_mask == 0, IGNORE_INDEX)


def _spearman_everywhere(local: torch.Tensor) -> float | None:
    """Spearman's rho of all ``[n, 2]`` (prediction, target) pairs, the same on every rank.

    Gathered over the data-parallel group, then sent from the last global rank (which
    holds the last pipeline stage) to all. None when there are no pairs.
    """
    pairs = gather_across_data_parallel_groups(local)
    rho = spearman(pairs[:, 0], pairs[:, 1]) if pairs.shape[0] > 1 else None
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box: list[Any] = [rho]
        dist.broadcast_object_list(box, src=dist.get_world_size() - 1)
        rho = box[0]
    return None if rho is None or math.isnan(rho) else rho
