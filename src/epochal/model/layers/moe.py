"""The mixture-of-experts MLP: a top-k router, routed experts, an optional shared expert.

Parameters (stable names, inside a block's ``mlp``)::

    router.weight                     [num_experts, hidden]     (no bias)
    experts.{e}.w1 / .w3 / .w2        one MLP per expert, inner width moe_ffn_size
                                      (or .fc1 / .fc2 for GELU; + biases if add_bias_linear)
    shared_expert.*                   an MLP of moe_shared_expert_intermediate_size (optional)
    shared_expert_gate.weight         [1, hidden]  (moe_shared_expert_gate only)
    expert_bias                       [num_experts] float32 buffer, in the checkpoint
                                      (moe_router_enable_expert_bias only)

Routing (:mod:`epochal.model.layers.router`, Megatron-Core's ``TopKRouter``): softmax
scores (Mixtral / Qwen-MoE) or sigmoid scores with the auxiliary-loss-free balancing
bias, group-limited routing and the routed scaling factor (DeepSeek-V3; the bias moves
after every step: :func:`update_expert_bias`). Each expert runs on the tokens routed to
it (every expert runs, on no tokens if none, so every parameter has a gradient); token
``t``'s output is ``sum_j w[t, j] * expert_{e[t, j]}(x_t)`` summed over its slots
``j = 0 .. k-1`` in that fixed order (no atomic scatter-add), so results do not depend on
how tokens are grouped. The shared expert's output (times
``sigmoid(shared_expert_gate(x))``) is added. Running the experts is the token dispatcher's job (:attr:`MoEMLP.dispatcher`, by default
:func:`local_expert_slots`, one expert at a time, or with ``moe_grouped_gemm``
:func:`~epochal.model.layers.grouped_experts.grouped_expert_slots`, one grouped GEMM per
projection): expert parallelism replaces it from outside
(:mod:`epochal.parallel.expert_parallel`), so the layer holds no collectives.

Capacity (``moe_expert_capacity_factor``, Megatron's ``"probs"`` drop policy): an
expert takes at most ``ceil(T * k / E * factor)`` of a micro-batch's ``T`` tokens'
assignments, those of highest probability (ties: the earlier token); a dropped
assignment contributes nothing (the residual connection carries the token).
Under context parallelism the capacity is per rank (its local tokens), as in Megatron-Core.

Auxiliary losses, per MoE block and micro-batch, over all its tokens (padding included,
as Megatron): the load-balancing loss of Switch Transformer in Megatron's normalisation,
``E / (T^2 k) * sum_e P_e * N_e`` (``P_e`` = summed probability of expert ``e``,
``N_e`` = its top-k assignments before any dropping; 1.0 when balanced; Hugging Face's
``load_balancing_loss_func`` is ``k`` times this), and the router z-loss
``mean_t(logsumexp(logits_t)^2)``. In training, ``moe_aux_loss_coeff * aux +
moe_z_loss_coeff * z`` joins the objective as Megatron's ``MoEAuxLossAutoScaler``
does: the layer's output carries it into the backward, where its gradient is
scaled by :attr:`MoEMLP.aux_grad_factor` (set with :func:`set_moe_aux_grad_factor` to the
factor the trainer scales the main loss's gradient by: ``1 / micro-batches``, times
a loss scale). So it works under any schedule, pipeline stages included, and the
reported language-model loss stays the cross-entropy alone (Megatron logs the
balance loss apart). Under context parallelism (:attr:`MoEMLP.token_sum` set) the
counts and token total are summed over the sequence's ranks and each rank's loss is
its share (see :meth:`MoEMLP._sequence_shares`), as Megatron-Core's router does over
its TP x CP group. :attr:`MoEMLP.last_stats` holds the last forward's losses and
token fractions per expert for the records (:func:`pop_moe_stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from epochal._eager import eager
from epochal.model.config import ModelConfig
from epochal.model.layers.grouped_experts import grouped_expert_slots
from epochal.model.layers.mlp import MLP
from epochal.model.layers.router import route, switch_aux_loss

__all__ = [
    "MoEMLP",
    "local_expert_slots",
    "moe_records",
    "pop_moe_stats",
    "reset_expert_counts",
    "take_moe_layer_stats",
    "route",
    "set_moe_aux_grad_factor",
    "switch_aux_loss",
    "update_expert_bias",
]


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on ``output``; in the backward the auxiliary loss gets the gradient ``layer.aux_grad_factor``."""

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux: torch.Tensor, layer: MoEMLP) -> torch.Tensor:
        ctx.layer = layer
        ctx.aux_shape = aux.shape
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        scale = torch.full(
            ctx.aux_shape, ctx.layer.aux_grad_factor, dtype=torch.float32, device=grad.device
        )
        return grad, scale, None


class MoEMLP(nn.Module):
    """The MoE feed-forward block over ``[..., hidden]`` (see the module docstring).

    Args:
        config: the model config (``num_experts`` set).
        layer_id: the block's index (names the records).
    """

    def __init__(self, config: ModelConfig, layer_id: int = 0) -> None:
        super().__init__()
        if config.num_experts is None:
            raise ValueError("MoEMLP needs config.num_experts")
        self.layer_id = layer_id
        self.num_experts = config.num_experts
        self.topk = config.moe_router_topk
        self.aux_loss_coeff = float(config.moe_aux_loss_coeff)
        self.z_loss_coeff = float(config.moe_z_loss_coeff)
        #: :func:`~epochal.model.layers.router.route`'s options (the bias aside: a buffer)
        self.routing: dict[str, Any] = dict(
            pre_softmax=config.moe_router_pre_softmax,
            capacity_factor=config.moe_expert_capacity_factor,
            score_function=config.moe_router_score_function,
            num_groups=config.moe_router_num_groups,
            group_topk=config.moe_router_group_topk,
            scaling_factor=config.moe_router_topk_scaling_factor,
        )
        self.bias_update_rate = float(config.moe_router_bias_update_rate)
        #: ``aux_loss`` (the micro-batch's), ``seq_aux_loss`` (per sequence) or ``none``
        self.load_balancing = config.moe_router_load_balancing_type
        #: the experts as grouped GEMMs (:mod:`~epochal.model.layers.grouped_experts`)
        self.grouped_gemm = config.moe_grouped_gemm
        #: the auxiliary-loss-free balancing bias (float32 ``[E]``, in the checkpoint) and
        #: the step's top-k assignments per expert so far (not saved: a step boundary has
        #: none); None without ``moe_router_enable_expert_bias``
        self.expert_bias: torch.Tensor | None
        self.expert_counts: torch.Tensor | None
        if config.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(config.num_experts))
            self.register_buffer("expert_counts", torch.zeros(config.num_experts), persistent=False)
        else:
            self.expert_bias = self.expert_counts = None
        h = config.hidden_size
        self.router = nn.Linear(h, config.num_experts, bias=False)
        self.experts = nn.ModuleList(
            MLP(config, ffn_size=config.moe_ffn_size) for _ in range(config.num_experts)
        )
        self.shared_expert: MLP | None = None
        self.shared_expert_gate: nn.Linear | None = None
        if config.moe_shared_expert_intermediate_size is not None:
            self.shared_expert = MLP(config, ffn_size=config.moe_shared_expert_intermediate_size)
            if config.moe_shared_expert_gate:
                self.shared_expert_gate = nn.Linear(h, 1, bias=False)
        #: the factor the trainer scales the main loss's gradient by (see :func:`set_moe_aux_grad_factor`).
        self.aux_grad_factor = 1.0
        #: the last forward's ``{"aux", "z", "tokens"}`` (detached; ``tokens`` = fraction per expert).
        self.last_stats: dict[str, torch.Tensor] | None = None
        #: the token dispatcher ``(layer, tokens, weights, experts, keep) -> slots``
        #: (:func:`local_expert_slots` when None); expert parallelism installs its own.
        self.dispatcher: Callable[..., torch.Tensor] | None = None
        #: sums a tensor (no gradient) over the ranks that hold other tokens of the same
        #: sequences (context parallelism installs it; None: this process holds them all).
        self.token_sum: Callable[[torch.Tensor], torch.Tensor] | None = None

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The balancing bias and the step's counts at zero (after ``to_empty``)."""
        for buffer in (self.expert_bias, self.expert_counts):
            if buffer is not None:
                buffer.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., hidden] -> [..., hidden]``."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.router(tokens)
        weights, experts, keep, probs = route(
            logits, self.topk, expert_bias=self.expert_bias, **self.routing
        )
        weights = weights.to(x.dtype)
        dispatch = self.dispatcher or (
            grouped_expert_slots if self.grouped_gemm else local_expert_slots
        )
        slots = dispatch(self, tokens, weights, experts, keep)
        parts = slots.unbind(1)  # one backward node (not one zero-filled gradient per slot)
        out = parts[0]
        for part in parts[1:]:  # a fixed order of summation
            out = out + part
        if self.shared_expert is not None:
            shared = self.shared_expert(tokens)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            out = out + shared
        out = out.reshape(shape)
        counts = torch.bincount(experts.reshape(-1), minlength=self.num_experts).float()
        if self.expert_counts is not None and self.training and torch.is_grad_enabled():
            # the bias's update reads the step's counts (Megatron-Core counts where
            # gradients are on: not in evaluations, nor in a recompute's first pass)
            self.expert_counts.add_(counts)
        if self.load_balancing == "seq_aux_loss":
            sequences = shape[0] if len(shape) == 3 else 1
            aux, z = self._sequence_balance(probs, experts, logits, sequences)
        elif self.token_sum is None:
            aux = switch_aux_loss(probs, counts, self.topk)
            z = torch.logsumexp(logits.float(), dim=-1).square().mean()
            self._record(aux, z, counts)
        else:
            aux, z = self._sequence_shares(probs, counts, logits)
        if self.load_balancing == "none":
            aux = aux.detach()  # recorded, not trained on
        objective = self.aux_loss_coeff * aux + self.z_loss_coeff * z
        if torch.is_grad_enabled() and objective.requires_grad and self.training:
            if self.aux_loss_coeff > 0 or self.z_loss_coeff > 0:
                out = _AttachAuxLoss.apply(out, objective, self)
        return out

    def _sequence_shares(
        self, probs: torch.Tensor, counts: torch.Tensor, logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's shares of the whole sequence's losses (Megatron-Core's form under CP).

        ``N_e`` and ``T`` are summed over the ranks (one ``token_sum``, no gradient), the
        probabilities stay local: ``aux_r = E / (T^2 k) * sum_e P_e^r * N_e`` and
        ``z_r = sum_local(lse^2) / T``, whose sums over the ranks are the one-process
        losses, and whose gradients (summed over the ranks with the weights') are the
        one-process gradients. The records hold the summed (global) values.
        """
        assert self.token_sum is not None
        e = self.num_experts
        p_local = probs.sum(0)
        lse2 = torch.logsumexp(logits.float(), dim=-1).square().sum()
        local_t = torch.tensor([float(probs.shape[0])], device=probs.device)
        stats = torch.cat([counts, p_local.detach(), local_t, lse2.detach().reshape(1)])
        stats = self.token_sum(stats)
        g_counts, g_p, t, g_lse2 = stats[:e], stats[e : 2 * e], stats[2 * e], stats[2 * e + 1]
        norm = e / (t * t * self.topk)
        aux = (p_local * g_counts).sum() * norm
        z = lse2 / t
        self._record((g_p * g_counts).sum() * norm, g_lse2 / t, g_counts)
        return aux, z

    def _sequence_balance(
        self, probs: torch.Tensor, experts: torch.Tensor, logits: torch.Tensor, sequences: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Megatron-Core's ``seq_aux_loss`` and the z-loss: the mean over the micro-batch's
        ``sequences`` of each sequence's switch loss (its own ``P_e``, ``N_e`` and tokens).

        Under context parallelism each sequence's ``N_e`` and token count (and the z-loss's
        sum) are summed over the ranks in one ``token_sum`` and the results are this rank's
        shares, as in :meth:`_sequence_shares`; the records hold the summed values.
        """
        e, n = self.num_experts, sequences
        p = probs.view(n, -1, e).sum(1)  # [n, E]
        offsets = torch.arange(n, device=experts.device).unsqueeze(1) * e
        flat = (experts.reshape(n, -1) + offsets).reshape(-1)
        counts = torch.bincount(flat, minlength=n * e).view(n, e).float()
        t = torch.full((n,), float(probs.shape[0] // n), device=probs.device)
        lse2 = torch.logsumexp(logits.float(), dim=-1).square().sum()
        g_p, g_lse2 = p.detach(), lse2.detach()
        if self.token_sum is not None:
            stats = torch.cat([counts.reshape(-1), g_p.reshape(-1), t, g_lse2.reshape(1)])
            stats = self.token_sum(stats)
            counts, g_p = stats[: n * e].view(n, e), stats[n * e : 2 * n * e].view(n, e)
            t, g_lse2 = stats[2 * n * e : 2 * n * e + n], stats[-1]
        norm = e / (t * t * self.topk)
        total = t.sum()
        self._record(((g_p * counts).sum(1) * norm).mean(), g_lse2 / total, counts.sum(0))
        return ((p * counts).sum(1) * norm).mean(), lse2 / total

    @eager
    def _record(self, aux: torch.Tensor, z: torch.Tensor, counts: torch.Tensor) -> None:
        self.last_stats = {
            "aux": aux.detach(),
            "z": z.detach(),
            "tokens": counts / counts.sum().clamp(min=1.0),
        }


def local_expert_slots(
    layer: MoEMLP,
    tokens: torch.Tensor,
    weights: torch.Tensor,
    experts: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """Every expert of ``layer`` on the tokens routed to it, in this process.

    Args:
        layer: the MoE layer (its ``experts``, ``topk``).
        tokens: ``[T, hidden]``.
        weights: ``[T, k]`` routing weights (zero where dropped).
        experts: ``[T, k]`` the expert of each slot.
        keep: ``[T, k]`` False where an assignment is dropped.

    Returns:
        ``[T, k, hidden]``: slot ``j`` of token ``t`` holds ``w[t, j] * expert_{e[t, j]}(x_t)``.
    """
    slots = tokens.new_zeros((tokens.shape[0], layer.topk, tokens.shape[-1]))
    for e, expert in enumerate(layer.experts):
        token_idx, slot_idx = ((experts == e) & keep).nonzero(as_tuple=True)
        y = expert(tokens[token_idx]) * weights[token_idx, slot_idx].unsqueeze(-1)
        slots[token_idx, slot_idx] = y.to(slots.dtype)
    return slots


def _biased_layers(parts: nn.Module | Sequence[nn.Module]) -> list[MoEMLP]:
    parts = [parts] if isinstance(parts, nn.Module) else parts
    return [
        m
        for part in parts
        for m in part.modules()
        if isinstance(m, MoEMLP) and m.expert_bias is not None
    ]


@torch.no_grad()
def update_expert_bias(
    parts: nn.Module | Sequence[nn.Module],
    reduce: Callable[[torch.Tensor], None] | None = None,
    *,
    apply: bool = True,
) -> None:
    """After a step: move every layer's expert bias towards balance, then clear its counts.

    DeepSeek-V3's auxiliary-loss-free balancing in Megatron-Core's form: with ``c_e``
    the step's top-k assignments of expert ``e`` (every micro-batch, every rank holding
    other tokens of the step) and ``m`` their mean over the experts,
    ``bias_e += rate * sign(m - c_e)``: an expert that took more than its share becomes
    less likely to be chosen. The counts are whole numbers, so their sum is exact and the
    update is the same in every layout (a rank counting each token several times, as
    tensor-parallel ranks do without sequence parallelism, changes no sign).

    Args:
        parts: the model (or its parts on this rank).
        reduce: sums a float32 ``[layers, E]`` tensor in place over the ranks that hold
            the same layers and other tokens (data, context, expert and tensor
            parallelism); None: this process saw every token.
        apply: False for a skipped step (a non-finite gradient): the counts are cleared
            and the bias kept, as the weights are.
    """
    layers = _biased_layers(parts)
    if not layers:
        return
    if apply:
        counts = torch.stack([m.expert_counts for m in layers])
        if reduce is not None:
            reduce(counts)
        for layer, c in zip(layers, counts, strict=True):
            mean = c.sum() / c.numel()
            layer.expert_bias.add_(torch.sign(mean - c) * layer.bias_update_rate)
    for layer in layers:
        layer.expert_counts.zero_()


def reset_expert_counts(parts: nn.Module | Sequence[nn.Module]) -> None:
    """Clear the step's counts of every biased MoE layer (a pipeline schedule's set-up forward)."""
    for layer in _biased_layers(parts):
        layer.expert_counts.zero_()


def set_moe_aux_grad_factor(module: nn.Module | Sequence[nn.Module], factor: float) -> None:
    """Set :attr:`MoEMLP.aux_grad_factor` of every MoE layer in ``module`` (no-op for a dense model).

    Args:
        module: a model or model part, or a list of them.
        factor: the factor the main loss's gradient is multiplied by in the backward
            (the fp16 loss scaler's scale / micro-batches; 1 / micro-batches without fp16).
    """
    for part in [module] if isinstance(module, nn.Module) else module:
        for sub in part.modules():
            if isinstance(sub, MoEMLP):
                sub.aux_grad_factor = float(factor)


def take_moe_layer_stats(module: nn.Module) -> list[tuple[int, dict[str, torch.Tensor]]]:
    """``(layer_id, stats)`` of every MoE layer in ``module`` with a record (then cleared).

    ``stats`` is the layer's :attr:`MoEMLP.last_stats`. :func:`moe_records` turns the
    layers' stats (of one model part, or gathered from several) into the records.
    """
    out = []
    for sub in module.modules():
        if isinstance(sub, MoEMLP) and sub.last_stats is not None:
            out.append((sub.layer_id, sub.last_stats))
            sub.last_stats = None
    return out


def moe_records(
    layer_stats: Sequence[tuple[int, dict[str, torch.Tensor]]],
) -> dict[str, torch.Tensor]:
    """The records of MoE layers' stats (:func:`take_moe_layer_stats`), in layer order.

    Returns:
        ``{"load_balancing_loss": mean over layers, "z_loss": mean over layers,
        "load_balancing_loss/layer_{i}", "tokens_per_expert/layer_{i}/expert_{e}"
        (the fraction of the top-k assignments)}``; empty without stats.
    """
    out: dict[str, torch.Tensor] = {}
    aux, z = [], []
    for layer_id, stats in sorted(layer_stats, key=lambda item: item[0]):
        aux.append(stats["aux"])
        z.append(stats["z"])
        out[f"load_balancing_loss/layer_{layer_id}"] = stats["aux"]
        for e, fraction in enumerate(stats["tokens"].tolist()):
            out[f"tokens_per_expert/layer_{layer_id}/expert_{e}"] = torch.tensor(fraction)
    if aux:
        out["load_balancing_loss"] = torch.stack(aux).mean()
        out["z_loss"] = torch.stack(z).mean()
    return out


def pop_moe_stats(module: nn.Module) -> dict[str, torch.Tensor]:
    """The records of the MoE layers' last forward in ``module`` (then cleared): :func:`moe_records`."""
    return moe_records(take_moe_layer_stats(module))
