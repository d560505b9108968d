"""Losses and evaluation metrics of the fine-tuning heads (pure functions; exact under any layout).

Losses are per micro-batch (each micro-batch weighs the same, Megatron's default):
MSE over every target of the micro-batch (BioNeMo's ``RegressorLossReduction``),
cross-entropy averaged over the valid labels (label ``>= 0``; BioNeMo's
``ClassifierLossReduction``: ``sum(ce * mask) / sum(mask)``).

Metrics: the trainer averages logged values over micro-batches and data-parallel
ranks, so ratios are logged as their parts (``sum`` terms, :func:`regression_sums`,
:func:`classification_counts`) and divided afterwards (:func:`pearson_from_sums`,
:func:`accuracy_from_counts`): a ratio of averages of sums is the ratio of the sums,
the value over the whole evaluation. Spearman's rank correlation needs every
prediction: :func:`spearman` of the gathered pairs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from epochal._masked_mean import masked_mean, mean_from_sum

__all__ = [
    "accuracy_from_counts",
    "classification_counts",
    "masked_cross_entropy",
    "masked_mse",
    "mse",
    "mse_from_sums",
    "pearson",
    "pearson_from_sums",
    "rank_average",
    "regression_sums",
    "spearman",
]

_SUMS = ("n", "sx", "sy", "sxx", "syy", "sxy")


def mse(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every element (float32 scalar)."""
    return F.mse_loss(predictions.float(), targets.float())


def masked_mse(
    predictions: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor
) -> torch.Tensor:
    """Mean squared error over the elements where ``scored`` is set (float32 scalar; 0 when none)."""
    errors = (predictions.float() - torch.nan_to_num(targets.float())) ** 2
    return mean_from_sum(torch.where(scored, errors, 0.0).sum(), scored.sum())


def mse_from_sums(values: Mapping[str, float]) -> float:
    """The mean squared error of (averaged) :func:`regression_sums` (NaN without pairs)."""
    n = float(values["reg n"])
    return float(values["reg sse"]) / n if n > 0 else float("nan")


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the labels ``>= 0`` (float32 scalar; 0 when none).

    Args:
        logits: ``[..., C]``.
        labels: int64 ``[...]``, negative where not scored (padding, ``<cls>``, unseen labels).
    """
    flat = labels.reshape(-1)
    valid = flat >= 0
    losses = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), flat.clamp(min=0), reduction="none"
    )
    return masked_mean(losses, valid)


def regression_sums(predictions: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """``n, sum x, sum y, sum x^2, sum y^2, sum xy`` and the squared error's sum (float64).

    For one target these are the sufficient statistics of Pearson's r; with several
    targets each statistic is summed over all elements (r of the flattened pairs).
    """
    x = predictions.detach().double().reshape(-1)
    y = targets.detach().double().reshape(-1)
    values = (
        torch.tensor(float(x.numel()), dtype=torch.float64),
        x.sum(),
        y.sum(),
        (x * x).sum(),
        (y * y).sum(),
        (x * y).sum(),
    )
    out = {f"reg {k}": v.cpu() for k, v in zip(_SUMS, values)}
    out["reg sse"] = ((x - y) ** 2).sum().cpu()
    return out


def pearson_from_sums(values: Mapping[str, float]) -> float:
    """Pearson's r from (averaged) :func:`regression_sums`; NaN when a side is constant."""
    n, sx, sy, sxx, syy, sxy = (float(values[f"reg {k}"]) for k in _SUMS)
    cov = n * sxy - sx * sy
    var = (n * sxx - sx * sx) * (n * syy - sy * sy)
    return cov / math.sqrt(var) if var > 0 else float("nan")


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson's r of two 1-D tensors (float64)."""
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    x, y = x - x.mean(), y - y.mean()
    denominator = math.sqrt(float((x * x).sum() * (y * y).sum()))
    return float((x * y).sum()) / denominator if denominator > 0 else float("nan")


def rank_average(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor, ties given their average rank (``scipy.stats.rankdata``)."""
    _, inverse, counts = torch.unique(
        x.double(), sorted=True, return_inverse=True, return_counts=True
    )
    ends = torch.cumsum(counts, 0).double()
    return (ends - (counts.double() - 1) / 2)[inverse]


def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman's rank correlation of two 1-D tensors (Pearson's r of their average ranks)."""
    return pearson(rank_average(x.reshape(-1)), rank_average(y.reshape(-1)))


def classification_counts(
    logits: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> dict[str, torch.Tensor]:
    """Correct and scored counts, overall and per class (``labels >= 0`` only).

    Returns:
        ``{"cls correct", "cls count", "cls correct k", "cls count k"}`` (float64 CPU scalars),
        and ``"cls unseen"``: labels marked ``-2`` (a class the training data did not have).
    """
    flat = labels.detach().reshape(-1)
    hits = logits.detach().reshape(-1, logits.shape[-1]).argmax(-1) == flat
    valid = flat >= 0
    out = {
        "cls correct": (hits & valid).sum(),
        "cls count": valid.sum(),
        "cls unseen": (flat == -2).sum(),
    }
    for k in range(num_classes):
        is_k = flat == k
        out[f"cls correct {k}"] = (hits & is_k).sum()
        out[f"cls count {k}"] = is_k.sum()
    return {k: v.double().cpu() for k, v in out.items()}


def accuracy_from_counts(values: Mapping[str, float], num_classes: int) -> dict[str, float]:
    """``accuracy`` and ``accuracy class k`` from (averaged) :func:`classification_counts`.

    A class absent from the evaluation gets no per-class entry; ``unseen labels`` is
    the share of evaluation labels whose class training never saw (scored as wrong
    by no one: they are left out of the accuracy).
    """
    out: dict[str, float] = {}
    count = float(values.get("cls count", 0.0))
    if count > 0:
        out["accuracy"] = float(values["cls correct"]) / count
    for k in range(num_classes):
        n = float(values.get(f"cls count {k}", 0.0))
        if n > 0:
            out[f"accuracy class {k}"] = float(values[f"cls correct {k}"]) / n
    unseen = float(values.get("cls unseen", 0.0))
    if unseen > 0:
        out["unseen labels"] = unseen / (unseen + count)
    return out
