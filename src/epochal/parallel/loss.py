"""Vocabulary-parallel cross-entropy: the loss on logits sharded over the vocabulary.

Under tensor parallelism the output head is column-parallel: each of the ``tp``
ranks holds the logits of a contiguous slice of the (padded) vocabulary,
``[b, s, V / tp]``. Gathering them would cost ``b * s * V`` floats per rank; like
Megatron-LM's ``vocab_parallel_cross_entropy`` we instead reduce three
``[b, s]`` tensors over the tensor-parallel group:

1. the maximum logit (all-reduce MAX), subtracted for stability;
2. the logit of the target token (each rank contributes it if the target is in
   its slice, else 0; all-reduce SUM);
3. ``sum(exp(logit - max))`` (all-reduce SUM).

``loss = log(sum_exp) - target_logit``. The backward needs no communication:
``grad = (softmax - one_hot(target)) * grad_loss`` on the local slice. The result
equals ``F.cross_entropy(full_logits, labels, reduction="none")`` up to float
rounding (computed in float32).

``vocab``: every function here takes the number of leading columns that join the
softmax (:attr:`epochal.model.ModelConfig.softmax_vocab_size`: the real ids of a model
read from a Hugging Face folder, whose padded ids transformers never sees); the columns
from ``vocab`` on are left out (sliced off when whole; ``-inf`` on the ranks whose
slice holds them, so their softmax and gradient are exactly 0). None = every column.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from epochal._masked_mean import masked_mean
from epochal.parallel.token_loss import plain_cross_entropy

__all__ = [
    "gather_vocab_shards",
    "masked_mean_loss_parallel",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_prediction_hits",
]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        group: dist.ProcessGroup,
        vocab: int | None,
    ) -> torch.Tensor:
        local_v = logits.shape[-1]
        rank = dist.get_rank(group)
        start = rank * local_v
        logits = _without_padded_columns(logits.float(), logits, vocab, start)
        logits_max = logits.max(dim=-1).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - logits_max.unsqueeze(-1)
        local_labels = labels - start
        outside = (local_labels < 0) | (local_labels >= local_v)
        local_labels = local_labels.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_labels.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        stacked = torch.stack([target_logit, sum_exp])
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM, group=group)
        target_logit, sum_exp = stacked[0], stacked[1]
        loss = sum_exp.log() - target_logit
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, local_labels, outside)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        softmax, local_labels, outside = ctx.saved_tensors
        grad = softmax.clone()
        inside = (~outside).to(grad.dtype)
        grad.scatter_add_(-1, local_labels.unsqueeze(-1), -inside.unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None


def _without_padded_columns(
    logits: torch.Tensor, original: torch.Tensor, vocab: int | None, start: int
) -> torch.Tensor:
    """``logits`` (a local slice starting at id ``start``) with ids ``>= vocab`` at ``-inf``.

    Never writes into ``original`` (the model's output, which ``logits`` may be).
    """
    if vocab is None or vocab - start >= logits.shape[-1]:
        return logits
    if logits is original:
        logits = logits.clone()
    logits[..., max(vocab - start, 0) :] = float("-inf")
    return logits


def vocab_parallel_cross_entropy(
    local_logits: torch.Tensor,
    labels: torch.Tensor,
    group: dist.ProcessGroup | None,
    vocab: int | None = None,
) -> torch.Tensor:
    """Per-token cross-entropy of vocabulary-sharded logits.

    Args:
        local_logits: this rank's slice ``[..., V / tp]`` of the logits; rank ``r``
            of ``group`` holds vocabulary ids ``[r * V/tp, (r+1) * V/tp)``.
        labels: int64 target ids ``[...]`` in ``[0, vocab)`` (``-100``: ignored when
            the logits are whole).
        group: the tensor-parallel process group; ``None`` (or a group of one)
            means the logits are not sharded (plain ``F.cross_entropy``).
        vocab: the ids that join the softmax (module docstring); None = all ``V``.

    Returns:
        float32 losses shaped like ``labels`` (identical on every rank of ``group``).
    """
    if group is None or dist.get_world_size(group) == 1:
        return plain_cross_entropy(local_logits, labels, vocab)
    return _VocabParallelCrossEntropy.apply(local_logits, labels, group, vocab)


def masked_mean_loss_parallel(
    labels: torch.Tensor,
    local_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    group: dist.ProcessGroup | None,
    vocab: int | None = None,
) -> torch.Tensor:
    """Megatron's GPT micro-batch loss on vocabulary-sharded logits.

    ``sum(ce * loss_mask) / max(sum(loss_mask), 1)``, the same value as the
    trainer's ``masked_token_mean_loss`` on the gathered logits.

    Args:
        labels: int64 ``[b, s]``.
        local_logits: ``[b, s, V / tp]`` (see :func:`vocab_parallel_cross_entropy`).
        loss_mask: ``[b, s]``, 1.0 where the token counts.
        group: the tensor-parallel group (or None).
        vocab: the ids that join the softmax (module docstring); None = all.

    Returns:
        float32 scalar.
    """
    losses = vocab_parallel_cross_entropy(local_logits, labels, group, vocab).flatten()
    mask = loss_mask.flatten().to(losses.dtype)
    return masked_mean(losses, mask)


@torch.no_grad()
def vocab_parallel_prediction_hits(
    local_logits: torch.Tensor,
    labels: torch.Tensor,
    group: dist.ProcessGroup | None,
    vocab: int | None = None,
) -> torch.Tensor:
    """Whether the highest logit is the label's, per token, on (possibly) vocabulary-sharded logits.

    Args:
        local_logits: this rank's slice ``[..., V / tp]`` (see :func:`vocab_parallel_cross_entropy`).
        labels: int64 ``[...]``; ids outside ``[0, V)`` (e.g. -1 / -100 for
            "not predicted") are never hits.
        group: the tensor-parallel group, or None when the logits are whole.
        vocab: the ids that compete for the top (module docstring); None = all.

    Returns:
        bool tensor shaped like ``labels`` (identical on every rank of ``group``).
        A tie with the maximum counts as a hit.
    """
    local_v = local_logits.shape[-1]
    sharded = group is not None and dist.get_world_size(group) > 1
    start = dist.get_rank(group) * local_v if sharded else 0
    logits = _without_padded_columns(local_logits.float(), local_logits, vocab, start)
    best = logits.max(dim=-1).values
    local_labels = labels - start
    outside = (local_labels < 0) | (local_labels >= local_v)
    target = logits.gather(-1, local_labels.masked_fill(outside, 0).unsqueeze(-1)).squeeze(-1)
    target = target.masked_fill(outside, float("-inf"))
    if sharded:
        dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(target, op=dist.ReduceOp.MAX, group=group)
    return target >= best


@torch.no_grad()
def gather_vocab_shards(
    local_logits: torch.Tensor, group: dist.ProcessGroup | None
) -> torch.Tensor:
    """The whole logits ``[..., V]`` from each rank's vocabulary slice ``[..., V / tp]``.

    A collective over ``group`` (every rank gets the same tensor); ``local_logits``
    itself when ``group`` is None or of one rank. Only for metrics: the loss never
    gathers (see :func:`vocab_parallel_cross_entropy`).
    """
    if group is None or dist.get_world_size(group) == 1:
        return local_logits
    local = local_logits.contiguous()
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local, group=group)
    return torch.cat(parts, dim=-1)
