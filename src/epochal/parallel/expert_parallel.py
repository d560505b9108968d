"""Expert parallelism: the routed experts of each MoE layer split over ranks, tokens sent with all-to-all.

``parallel.expert_parallel = P`` (Megatron's ``--expert-model-parallel-size``) carves
expert-parallel groups of ``P`` ranks out of the data-parallel ranks: data-parallel
rank ``d`` is expert-parallel rank ``d % P`` of expert-data-parallel rank ``d // P``
(the ranks of one expert-parallel group are adjacent, as in Megatron). Expert-parallel
rank ``r`` holds experts ``r * E/P .. (r + 1) * E/P - 1`` of every MoE layer (``E =
model.num_experts``), under their global names (``layers.{i}.mlp.experts.{e}.*``), so
checkpoints name every expert as one process does and load under any ``P``.

The MoE layer calls a token dispatcher (:attr:`epochal.model.layers.moe.MoEMLP.dispatcher`);
:func:`apply_expert_parallel` installs this module's. For each micro-batch, each rank
routes its own tokens (router, top-k, capacity, balance and z-losses and the records
are computed locally, exactly as one process does for that micro-batch), then:

1. the number of assignments per expert is exchanged (an all-to-all of ``E`` integers);
2. *dispatch*: the rows routed to each expert, in the order one process gathers them
   (token order, per expert), go to the expert's owner (one all-to-all);
3. the owner runs each expert **separately on each source rank's rows**: the same rows,
   in the same order, as one process runs it on that micro-batch;
4. *combine*: the outputs go back (one all-to-all), are weighted and added per token in
   the fixed slot order of :func:`~epochal.model.layers.moe.local_expert_slots`.

The backward pass mirrors it (the two all-to-alls in reverse). The gradients that reach
the tokens are added in the order one process adds them, so EP changes no bits of
anything but the expert weights' gradients, whose contributions come from several
micro-batches in one backward pass:

- the exact gradient synchronisation: each expert call's weight gradient is captured on its
  own (not accumulated by autograd); after the step's last backward they are added in
  the global micro-batch order (``k = i * dp + d``, as
  :mod:`epochal.parallel.ordered_reduce` does for every other weight), the contributions
  of the other expert-data-parallel ranks gathered first. EP then trains the bits of
  one process (``tests/parallel/test_expert_parallel.py``).
- otherwise: autograd adds the contributions, they are summed over the
  expert-data-parallel group (an all-reduce) and divided by the data-parallel size,
  which gives the data-parallel mean as for every other weight.

Expert weights are plain tensors kept out of the data-parallel wrapper (FSDP2
``ignored_params``): non-expert weights reduce over the whole data-parallel group as
without EP, expert weights over the ``dp / P`` ranks that hold the same experts. They and
their optimizer state are replicated over those ranks (``dp_sharding`` shards the
non-expert weights only). Gradient clipping counts each expert once
(:meth:`ExpertParallel.clip_grad_norm`).

Cost: per MoE layer and micro-batch, three all-to-alls forward and two backward; the
token all-to-alls carry ``(assignments kept) * hidden`` elements each, of which the
fraction ``(P - 1) / P`` leaves the rank when routing is balanced. The layout-invariant
mode keeps each expert call's weight gradient until the step ends
(``micro-batches * P`` copies of the local experts' gradients) and gathers them over the
expert-data-parallel group once per step.

With context parallelism, the expert-parallel groups are carved from the data-parallel
ranks that share a context-parallel coordinate: each rank dispatches the tokens of its
own sequence chunks to their experts (the balance loss's counts are summed over the
context-parallel group by :func:`~epochal.parallel.context_parallel.apply_context_parallel`).

With tensor parallelism (Megatron's expert tensor-parallel size equal to the
tensor-parallel size), the expert-parallel groups are carved from the data-parallel
ranks that share a tensor-parallel coordinate, and each expert's weights are split over
the tensor-parallel ranks as without expert parallelism
(:mod:`epochal.parallel.tensor_parallel_moe`): every tensor-parallel rank routes the
whole (replicated or all-gathered) micro-batch the same way, sends the rows to the
rank at its own tensor-parallel coordinate in the expert's group, whose shard gives a
partial sum; the combined slots are partial sums, reduced once per layer over the
tensor-parallel group as without expert parallelism. Expert gradients are then
tensor-parallel local shards; the ordered sums above work on the local shards, and a
``Partial`` one (a row-parallel bias) is summed over the tensor-parallel ranks in rank
order when it is installed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.func import functional_call

from epochal._eager import eager
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.layers.moe import MoEMLP
from epochal.parallel.ordered_reduce import placed_grad

__all__ = [
    "ExpertParallel",
    "LocalExperts",
    "apply_expert_parallel",
    "check_expert_parallel",
    "expert_parameters",
]


def check_expert_parallel(dims: Any, model: ModelConfig) -> None:
    """Refuse an expert-parallel size the model cannot use.

    Args:
        dims: the layout (a :class:`~epochal.parallel.dims.ParallelDims`, ``ep > 1``).
        model: the model config.

    Raises:
        ConfigError: naming ``parallel.expert_parallel``: a dense model, or a size that
            does not divide ``model.num_experts``.
    """
    n = getattr(model, "num_experts", None)
    if n is None:
        raise ConfigError(
            "parallel.expert_parallel",
            f"is {dims.ep} but the model has no mixture-of-experts layers (model.num_experts "
            "is unset); set model.num_experts or leave expert_parallel at 1",
        )
    if getattr(model, "moe_grouped_gemm", False):
        raise ConfigError(
            "model.moe_grouped_gemm",
            "runs a layer's experts where its tokens are; under expert parallelism each "
            "expert runs on its owner's received rows: set moe_grouped_gemm=false",
        )
    if n % dims.ep:
        raise ConfigError(
            "parallel.expert_parallel",
            f"must divide model.num_experts={n} (each rank holds num_experts / "
            f"expert_parallel experts), got {dims.ep}",
        )


class LocalExperts(nn.ModuleDict):
    """This rank's experts of one MoE layer, keyed by their global index (``"2"``, ``"3"``)."""


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of the expert-parallel experts in ``module`` (each once; empty without EP)."""
    out: list[nn.Parameter] = []
    seen: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, LocalExperts):
            for p in sub.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a plain tensor as it is)."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _replicated(param: torch.Tensor) -> bool:
    """Whether ``param`` is the same on every tensor-parallel rank (a plain tensor or ``Replicate``)."""
    return not isinstance(param, DTensor) or all(pl.is_replicate() for pl in param.placements)


def _install(param: nn.Parameter, local: torch.Tensor, placements: Any) -> None:
    """``local`` (this rank's gradient values) as ``param.grad``, in ``param``'s placements.

    ``placements`` are the gradient's as autograd gave them (None: a plain tensor); a
    ``Partial`` one is summed over its mesh dimension in rank order.
    """
    if not isinstance(param, DTensor):
        param.grad = local
        return
    grad = DTensor.from_local(
        local, param.device_mesh, placements, shape=param.shape, stride=param.stride()
    )
    param.grad = placed_grad(param, grad)


def _staged(tensor: torch.Tensor, group: dist.ProcessGroup) -> bool:
    return tensor.is_cuda and dist.get_backend(group) == "gloo"


def _all_to_all_rows(
    send: torch.Tensor,
    send_rows: list[int],
    recv_rows: list[int],
    group: dist.ProcessGroup,
) -> torch.Tensor:
    """``send`` (``[sum(send_rows), w]``) split by rows over the ranks; what every rank sent here."""
    device = send.device
    staged = _staged(send, group)
    src = send.detach().cpu() if staged else send.detach().contiguous()
    recv = src.new_empty((sum(recv_rows), *src.shape[1:]))
    dist.all_to_all_single(
        recv, src, output_split_sizes=recv_rows, input_split_sizes=send_rows, group=group
    )
    return recv.to(device) if staged else recv


def _pieces(flat: torch.Tensor, rows: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """``flat`` cut into pieces of ``rows`` rows, each a fresh tensor (as one process's gathers)."""
    out, start = [], 0
    for n in rows:
        out.append(flat[start : start + n].clone())
        start += n
    return tuple(out)


class _AllToAll(torch.autograd.Function):
    """Pieces of rows to the ranks of a group and back: forward one all-to-all, backward the reverse.

    Inputs are the pieces in send order (grouped by destination rank); outputs the
    received pieces (grouped by source rank), each a fresh tensor.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        group: dist.ProcessGroup,
        send_rows: list[int],
        recv_pieces: list[int],
        recv_rows: list[int],
        *pieces: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.group, ctx.send_rows, ctx.recv_rows = group, send_rows, recv_rows
        ctx.piece_rows = [int(p.shape[0]) for p in pieces]
        ctx.recv_pieces = recv_pieces
        send = torch.cat(pieces)
        ctx.like = send.new_empty((0, *send.shape[1:]))
        recv = _all_to_all_rows(send, send_rows, recv_rows, group)
        return _pieces(recv, recv_pieces)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        like = ctx.like
        full = [
            g if g is not None else like.new_zeros((n, *like.shape[1:]))
            for g, n in zip(grads, ctx.recv_pieces)
        ]
        back = _all_to_all_rows(torch.cat(full), ctx.recv_rows, ctx.send_rows, ctx.group)
        return (None, None, None, None, *_pieces(back, ctx.piece_rows))


class _Tap(torch.autograd.Function):
    """Identity on a weight; its gradient goes to ``sink.take(key, grad)`` instead of ``.grad``."""

    @staticmethod
    def forward(ctx: Any, param: torch.Tensor, sink: ExpertParallel, key: tuple) -> torch.Tensor:  # type: ignore[override]
        ctx.sink, ctx.key = sink, key
        return param.view_as(param)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        ctx.sink.take(ctx.key, grad)
        return None, None, None


class _Dispatcher:
    """The token dispatcher of one MoE layer under expert parallelism (module docstring)."""

    def __init__(self, ep: ExpertParallel, first: int, count: int) -> None:
        self.ep, self.first, self.count = ep, first, count

    @eager  # collectives and data-dependent sizes: runs eagerly
    def __call__(
        self,
        layer: MoEMLP,
        tokens: torch.Tensor,
        weights: torch.Tensor,
        experts: torch.Tensor,
        keep: torch.Tensor,
    ) -> torch.Tensor:
        ep, local = self.ep, self.count
        size = ep.size
        selected = [
            ((experts == e) & keep).nonzero(as_tuple=True) for e in range(layer.num_experts)
        ]
        counts = [int(token_idx.numel()) for token_idx, _ in selected]
        received = ep.exchange_counts(counts, tokens.device)
        send_rows = [sum(counts[d * local : (d + 1) * local]) for d in range(size)]
        recv_rows = [sum(received[s * local : (s + 1) * local]) for s in range(size)]
        pieces = [tokens[token_idx] for token_idx, _ in selected]
        inputs = _AllToAll.apply(ep.group, send_rows, received, recv_rows, *pieces)
        outputs = []
        for s in range(size):  # each source rank's rows on their own: one process's rows
            for j in range(local):
                expert = layer.experts[str(self.first + j)]
                outputs.append(ep.run_expert(expert, inputs[s * local + j], s, layer.training))
        back = _AllToAll.apply(ep.group, recv_rows, counts, send_rows, *outputs)
        slots = tokens.new_zeros((tokens.shape[0], layer.topk, tokens.shape[-1]))
        for e, (token_idx, slot_idx) in enumerate(selected):
            y = back[e] * weights[token_idx, slot_idx].unsqueeze(-1)
            slots[token_idx, slot_idx] = y.to(slots.dtype)
        return slots


def _groups(
    dims: Any, rank: int
) -> tuple[dist.ProcessGroup, dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's expert-parallel, expert-data-parallel and expert x tensor-parallel groups.

    Every rank creates all of them, in the same order. The third (None without tensor
    parallelism) holds the ranks whose expert shards make up one expert-data-parallel
    replica of every expert: the expert-parallel ranks times the tensor-parallel ranks.
    """
    ep, edp = dims.ep, dims.dp // dims.ep

    def global_rank(pp: int, dp: int, cp: int, tp: int) -> int:
        return pp * (dims.dp * dims.cp * dims.tp) + dp * (dims.cp * dims.tp) + cp * dims.tp + tp

    mine_ep = mine_edp = mine_ep_tp = None
    for pp in range(dims.pp):
        for cp in range(dims.cp):
            for tp in range(dims.tp):
                for q in range(edp):
                    ranks = [global_rank(pp, q * ep + r, cp, tp) for r in range(ep)]
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        mine_ep = group
                for r in range(ep):
                    ranks = [global_rank(pp, q * ep + r, cp, tp) for q in range(edp)]
                    group = dist.new_group(ranks) if edp > 1 else None
                    if rank in ranks:
                        mine_edp = group
            if dims.tp > 1:
                for q in range(edp):
                    ranks = sorted(
                        global_rank(pp, q * ep + r, cp, tp)
                        for r in range(ep)
                        for tp in range(dims.tp)
                    )
                    group = dist.new_group(ranks)
                    if rank in ranks:
                        mine_ep_tp = group
    assert mine_ep is not None
    return mine_ep, mine_edp, mine_ep_tp


class ExpertParallel:
    """This rank's place in expert parallelism, its groups, and the expert weights' gradients.

    Args:
        dims: the layout (a :class:`~epochal.parallel.dims.ParallelDims`, ``ep > 1``).
        invariant: the exact gradient synchronisation (ordered expert-gradient sums).

    Attributes:
        size: the expert-parallel size ``P``.
        rank: this rank's expert-parallel rank (``dp_rank % P``).
        edp_rank: its expert-data-parallel rank (``dp_rank // P``); ``edp`` their count.
        group: the expert-parallel group (the all-to-alls).
        edp_group: the ranks holding the same experts (None when ``P == dp``).
        ep_tp_group: the expert-parallel times tensor-parallel ranks (None without
            tensor parallelism).
    """

    def __init__(self, dims: Any, *, invariant: bool) -> None:
        coords = dims.coords(dist.get_rank())
        self.size, self.dp = dims.ep, dims.dp
        self.rank, self.edp_rank = coords["dp"] % dims.ep, coords["dp"] // dims.ep
        self.edp = dims.dp // dims.ep
        self.coords = coords
        self.group, self.edp_group, self.ep_tp_group = _groups(dims, dist.get_rank())
        self.tp_rank = coords["tp"]
        self.invariant = invariant
        self.parts: list[nn.Module] = []
        self._contributions: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._placements: dict[int, Any] = {}

    # ----------------------------------------------------------------- building
    def local_range(self, num_experts: int) -> range:
        """The global indices of this rank's experts."""
        n = num_experts // self.size
        return range(self.rank * n, (self.rank + 1) * n)

    def shard(self, part: nn.Module) -> nn.Module:
        """Keep this rank's experts of every MoE layer of ``part`` and install the dispatcher.

        Call it before the weights are materialised (on the meta device) and
        initialised: the experts keep their global names, so they get one process's
        initial values.
        """
        for layer in part.modules():
            if isinstance(layer, MoEMLP) and not isinstance(layer.experts, LocalExperts):
                keep = self.local_range(layer.num_experts)
                layer.experts = LocalExperts({str(e): layer.experts[e] for e in keep})
                layer.dispatcher = _Dispatcher(self, keep.start, len(keep))
        self.parts.append(part)
        return part

    def parameters(self) -> list[nn.Parameter]:
        """This rank's expert weights (all parts)."""
        out: list[nn.Parameter] = []
        for part in self.parts:
            out += expert_parameters(part)
        return out

    # ------------------------------------------------------------------ forward
    def exchange_counts(self, counts: list[int], device: torch.device) -> list[int]:
        """Send the assignments per expert to the experts' owners; return ``[source][local expert]`` flat."""
        on = torch.device("cpu") if dist.get_backend(self.group) == "gloo" else device
        send = torch.tensor(counts, dtype=torch.int64, device=on)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        return [int(v) for v in recv.tolist()]

    def run_expert(
        self, expert: nn.Module, rows: torch.Tensor, source: int, training: bool
    ) -> torch.Tensor:
        """``expert(rows)``; layout-invariant training captures its weight gradients per source."""
        if not (self.invariant and training and torch.is_grad_enabled()):
            return expert(rows)
        tapped = {
            name: _Tap.apply(p, self, (id(p), source))
            for name, p in expert.named_parameters()
            if p.requires_grad
        }
        return functional_call(expert, tapped, (rows,))

    def take(self, key: tuple[int, int], grad: torch.Tensor) -> None:
        """One expert call's weight gradient (layout-invariant mode), in backward order.

        A DTensor gradient (tensor parallelism) is kept as its local shard; its
        placements are remembered for :meth:`_ordered_grads`.
        """
        if isinstance(grad, DTensor):
            self._placements[key[0]] = grad.placements
        self._contributions.setdefault(key, []).append(_local(grad).detach())

    # ---------------------------------------------------------------- gradients
    @torch.no_grad()
    def finish_grads(self) -> None:
        """Make the expert weights' gradients final (after the step's last backward; a collective)."""
        params = [p for p in self.parameters() if p.requires_grad]
        if self.invariant:
            self._ordered_grads(params)
            return
        with_grads = [p for p in params if p.grad is not None]
        grads = [_local(p.grad) for p in with_grads]
        if not grads:
            return
        if self.edp_group is not None:
            flat = torch.cat([g.reshape(-1) for g in grads])
            staged = _staged(flat, self.edp_group)
            buf = flat.cpu() if staged else flat
            dist.all_reduce(buf, group=self.edp_group)
            flat = buf.to(flat.device) if staged else buf
            start = 0
            for g in grads:
                g.copy_(flat[start : start + g.numel()].view_as(g))
                start += g.numel()
        for g in grads:
            g.div_(self.dp)
        for p in with_grads:  # tensor parallelism: a Partial gradient summed in rank order
            if isinstance(p, DTensor):
                p.grad = placed_grad(p, p.grad)

    def _ordered_grads(self, params: list[nn.Parameter]) -> None:
        """Add every expert call's gradient in the global micro-batch order and install it."""
        taken = [
            [self._contributions.pop((id(p), s), []) for s in range(self.size)] for p in params
        ]
        self._contributions.clear()
        n = len(taken[0][0]) if taken else 0
        if n == 0:
            return
        for per_source in taken:
            if any(len(c) != n for c in per_source):
                raise RuntimeError(
                    "expert parallelism: an expert's gradient contributions do not match the "
                    f"micro-batches ({[len(c) for c in per_source]} for {n})"
                )
        # [n, P, numel of all local experts]: micro-batch i, source rank s
        local = torch.stack(
            [
                torch.stack(
                    [torch.cat([c[s][i].reshape(-1) for c in taken]) for s in range(self.size)]
                )
                for i in range(n)
            ]
        )
        if self.edp_group is not None:
            staged = _staged(local, self.edp_group)
            src = local.cpu() if staged else local.contiguous()
            out = src.new_empty((self.edp, *src.shape))
            dist.all_gather_single(out.view(-1), src.view(-1), group=self.edp_group)
            every = out.to(local.device) if staged else out
        else:
            every = local.unsqueeze(0)
        acc: torch.Tensor | None = None
        for i in range(n):  # k = i * dp + q * P + s: the global micro-batch order
            for q in range(self.edp):
                for s in range(self.size):
                    g = every[q, i, s]
                    acc = g.clone() if acc is None else acc.add_(g)
        assert acc is not None
        start = 0
        for p in params:
            local = _local(p)
            grad = acc[start : start + local.numel()].view_as(local).clone()
            _install(p, grad, self._placements.get(id(p), getattr(p, "placements", None)))
            start += local.numel()
        self._placements.clear()

    def norm_group(self) -> dist.ProcessGroup:
        """The group the experts' gradient norm is summed over (expert x tensor-parallel
        ranks where the experts are also split by tensor parallelism)."""
        return self.ep_tp_group if self.ep_tp_group is not None else self.group

    def norm_replicas(self) -> list[nn.Parameter]:
        """Expert parameters this rank leaves out of the norm: a tensor-parallel replica
        (a row-parallel bias) counts on tensor-parallel rank 0 only."""
        if self.ep_tp_group is None or self.tp_rank == 0:
            return []
        return [p for p in self.parameters() if _replicated(p)]


def apply_expert_parallel(part: nn.Module, ep: ExpertParallel) -> nn.Module:
    """:meth:`ExpertParallel.shard` (a function for symmetry with the other ``apply_*``)."""
    return ep.shard(part)
