"""The mixture-of-experts router: scores, top-k choice, weights, and the balancing losses' inputs.

Two score functions (Megatron-Core's ``--moe-router-score-function``):

- ``softmax`` (Mixtral, Qwen-MoE): ``probs = softmax(logits)`` over all experts
  (float32); the ``k`` largest are kept and, unless ``pre_softmax``, renormalised to
  sum to 1.
- ``sigmoid`` (DeepSeek-V3): each expert's score is ``sigmoid(logit)``; the top-k are
  chosen on ``score + expert_bias`` (the auxiliary-loss-free balancing bias, which
  moves the choice only), and the chosen *scores* (without the bias) renormalised to
  sum to 1 when ``k > 1`` (``s / (sum + 1e-20)``, Megatron-Core's form). The
  balancing loss then reads the scores renormalised over all experts.

Group-limited routing (``num_groups``, ``group_topk``; DeepSeek-V2/V3's device- and
node-limited routing, Megatron-Core's ``group_limited_topk``): the experts in
``num_groups`` equal groups of consecutive ids, a group scored by the sum of its top
``k / group_topk`` choice scores, each token choosing its top-k among the experts of
its ``group_topk`` best groups. The choice scores are the logits for softmax without
``pre_softmax`` (as Megatron-Core chooses on logits there), the probabilities with it,
the biased sigmoid scores for sigmoid.

``scaling_factor`` (DeepSeek-V3's ``routed_scaling_factor``) multiplies the weights
last. Capacity (``capacity_factor``, Megatron's ``"probs"`` drop policy) then keeps
each expert's ``ceil(T * k / E * factor)`` assignments of highest weight.
"""

from __future__ import annotations

import math

import torch

__all__ = ["group_limited_topk", "route", "switch_aux_loss"]


def switch_aux_loss(probs: torch.Tensor, counts: torch.Tensor, topk: int) -> torch.Tensor:
    """Switch Transformer's load-balancing loss, Megatron's normalisation (1.0 when balanced).

    Args:
        probs: float32 ``[T, E]`` scores over all experts (softmax, or renormalised sigmoid).
        counts: ``[E]`` top-k assignments per expert (sums to ``T * topk``).
        topk: experts per token.
    """
    t, e = probs.shape
    return (probs.sum(0) * counts.to(probs.dtype)).sum() * (e / (t * t * topk))


def group_limited_topk(
    scores: torch.Tensor, topk: int, num_groups: int, group_topk: int
) -> torch.Tensor:
    """The top-``topk`` experts (int64 ``[T, topk]``) within each token's best ``group_topk`` groups.

    ``scores`` ``[T, E]``: the choice scores, ``E`` divisible by ``num_groups`` (module
    docstring). Experts of the other groups are masked with ``-inf``.
    """
    t, e = scores.shape
    grouped = scores.view(t, num_groups, e // num_groups)
    group_scores = grouped.topk(topk // group_topk, dim=-1).values.sum(dim=-1)
    best = group_scores.topk(group_topk, dim=-1, sorted=False).indices
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    allowed = allowed.unsqueeze(-1).expand(t, num_groups, e // num_groups).reshape(t, e)
    return scores.masked_fill(~allowed, float("-inf")).topk(topk, dim=-1).indices


def route(
    logits: torch.Tensor,
    topk: int,
    *,
    pre_softmax: bool = False,
    capacity_factor: float | None = None,
    score_function: str = "softmax",
    expert_bias: torch.Tensor | None = None,
    num_groups: int | None = None,
    group_topk: int | None = None,
    scaling_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing of ``T`` tokens (module docstring).

    Args:
        logits: router logits ``[T, E]``.
        topk: experts per token.
        pre_softmax: softmax: keep the top-k probabilities as they are (no renormalisation).
        capacity_factor: None (dropless) or the per-expert capacity factor.
        score_function: ``"softmax"`` or ``"sigmoid"``.
        expert_bias: sigmoid only: float32 ``[E]`` added to the scores for the choice.
        num_groups, group_topk: group-limited routing (both, or neither).
        scaling_factor: the weights' factor (None: 1).

    Returns:
        ``(weights [T, k] float32, experts [T, k] int64, keep [T, k] bool, probs [T, E] float32)``:
        the weights are zero where ``keep`` is False (dropped assignments); ``probs`` are
        the scores the balancing loss reads.

    Raises:
        ValueError: an unknown ``score_function``.
    """
    if score_function == "sigmoid":
        scores = torch.sigmoid(logits.float())
        choice = (scores if expert_bias is None else scores + expert_bias).detach()
        experts = _choose(choice, topk, num_groups, group_topk)
        weights = scores.gather(1, experts)
        if topk > 1:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    elif score_function == "softmax":
        probs = torch.softmax(logits.float(), dim=-1)
        if num_groups is None:
            weights, experts = probs.topk(topk, dim=-1)
        else:
            choice = (probs if pre_softmax else logits.float()).detach()
            experts = _choose(choice, topk, num_groups, group_topk)
            weights = probs.gather(1, experts)
        if not pre_softmax:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    else:
        raise ValueError(f"score_function must be 'softmax' or 'sigmoid', got {score_function!r}")
    if scaling_factor is not None:
        weights = weights * scaling_factor
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor is not None:
        t, e = probs.shape
        capacity = math.ceil(t * topk / e * capacity_factor)
        flat_e, flat_w = experts.reshape(-1), weights.detach().reshape(-1)
        flat_keep = keep.reshape(-1)
        for expert in range(e):
            slots = (flat_e == expert).nonzero(as_tuple=True)[0]
            if slots.numel() > capacity:
                order = torch.sort(flat_w[slots], descending=True, stable=True).indices
                flat_keep[slots[order[capacity:]]] = False
        weights = weights * keep
    return weights, experts, keep, probs


def _choose(
    scores: torch.Tensor, topk: int, num_groups: int | None, group_topk: int | None
) -> torch.Tensor:
    if num_groups is None or group_topk is None:
        return scores.topk(topk, dim=-1).indices
    return group_limited_topk(scores, topk, num_groups, group_topk)
