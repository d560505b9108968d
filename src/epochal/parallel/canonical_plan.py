"""A GPT, BERT, ESM-2 or T5 model (or pipeline stage) computed in canonical units, on one process or sharded.

GPT models run on any tensor-, sequence- and context-parallel layout the degree
divides; BERT and ESM-2 under tensor, sequence and context parallelism (ESM-2 padded or
packed, token dropout on), T5 under tensor parallelism.
Mixture-of-experts blocks (GPT) under tensor, sequence, context and expert parallelism:
each routed expert and the shared expert compute as the dense MLP does, the router
replicated, the layer on the whole sequence (gathered under SP and CP).

With ``training.layout_invariant`` and ``parallel.invariant_degree = D > 1``
every reduction that tensor or sequence parallelism may split runs in the ``D``
canonical chunks of :mod:`epochal.parallel.canonical_ops`, on one process as on
any tensor-parallel size that divides ``D``, with or without sequence
parallelism, so all of them compute the same bits:

==========================  ==========================================================
module                      canonical computation
==========================  ==========================================================
``wq``/``wk``/``wv``,       column linear (:func:`column_linear`): ``D`` output chunks,
``fc1``/``w1``/``w3``,      the input gradient's tree over them; under tensor
``output``                  parallelism this rank's ``D / n`` chunks (Megatron's
                            column-parallel weights, ``Shard(0)`` DTensors)
QK-norm                     ``xhat * weight + bias`` per head, each head's gradient a
                            token sum, the heads' added in global head order after a
                            gather over the group (:func:`head_scale_shift`)
``wo``, ``fc2``/``w2``      row linear (:func:`row_linear`): the product's tree over
                            ``D`` input chunks and the group (``Shard(1)`` weights);
                            reduce-scattered over the sequence under sequence
                            parallelism; the bias added after, its gradient a token sum
norms                       ``xhat * weight + bias``, the parameter gradients token
                            sums in ``D`` sequence chunks (:func:`scale_shift`);
                            whole parameters on every rank
``tok_embeddings``,         :mod:`~epochal.parallel.canonical_embedding`: the token
``pos_embeddings``          table's rows vocabulary-parallel (the all-reduce adds one
                            value and zeros: exact in any order); the gradient per
                            folded sequence chunk, added as the folded tree
hidden / embedding dropout  a mask drawn for the whole tensor, this rank's sequence
                            positions kept (:class:`PositionDropout`)
attention                   per head as in one process (the kernel's result for a head
                            does not depend on how many heads a call holds); attention
                            dropout drawn per global head (:class:`KeyedHeadAttention`);
                            under context parallelism the heads are exchanged so that
                            each rank holds whole heads over the whole sequence
                            (:mod:`~epochal.parallel.canonical_context`)
loss                        :func:`canonical_cross_entropy` (the vocabulary in ``D``
                            chunks)
T5                          the cross-attention's ``wq``/``wk``/``wv`` column and ``wo``
                            row linears, its norm, both stacks' final norms; its dropout
                            per global head ``heads + h`` (a stream apart from the
                            self-attention's); the relative bias tables whole on every
                            rank, each self-attention adding its heads' slice, their
                            gradient (a rank's heads' columns) summed over the group
BERT / ESM-2 head           ``lm_head.dense`` a column linear replicated on every rank,
                            ``lm_head.norm`` a norm, the decoder's bias vocabulary-
                            sharded with its gradient per ``V / D`` columns
                            (:func:`add_vocabulary_bias`); token types and the
                            embedding norm as the tables and norms above
binary and fine-tuning      replicated on every rank and computed as in one process
heads                       on the whole sequence (gathered under sequence parallelism,
                            where an encoder's embedding stage also runs whole and
                            keeps this rank's slice: :func:`keep_sequence_slice`)
==========================  ==========================================================

Under sequence parallelism the attention's and the MLP's inputs are gathered
once (:func:`gather_sequence`); each column linear reduce-scatters its own input
gradient (the tree) and pads it with zeros to the whole sequence, so the
gradients of ``wq``, ``wk`` and ``wv`` add in the order one process adds them.

Weight, bias, norm and embedding gradients sum over tokens: in ``2 D`` folded
sequence chunks (:func:`~epochal.parallel.canonical.folded_token_sum`), so that a
context-parallel rank's tokens form a subtree that its group completes.

Where the units cannot hold, :func:`canonical_refusal` says why (the run then
keeps the data-parallel rule only): a model type other than GPT, BERT, ESM-2 or T5, experts
with biases,
heads that do not split over ``tp x cp`` ranks (replicated key/value
projections, or the head exchange),
fine-tuning heads and the BERT binary head on packed rows under context
parallelism, T5 under sequence or context parallelism,
sizes that do not split into ``D`` chunks (the sequence into ``2 D``), ALiBi or
windows with attention dropout.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from epochal.data.epochs.permutation import derive_seed
from epochal.model.config import ModelConfig
from epochal.model.layers.mlp import ACTIVATION_FUNCTIONS, GATED_ACTIVATIONS
from epochal.model.layers.moe import MoEMLP
from epochal.model.layers.packing import PackedSequences
from epochal.parallel.canonical import Reductions, sequence_all_gather
from epochal.parallel.canonical_context import HeadExchangeAttention
from epochal.parallel.canonical_deferred import DeferredCompletion
from epochal.parallel.canonical_embedding import install_canonical_embedding
from epochal.parallel.canonical_ops import (
    add_vocabulary_bias,
    column_linear,
    gather_sequence,
    head_scale_shift,
    keep_sequence_slice,
    row_linear,
    scale_shift,
)
from epochal.parallel.canonical_step_sum import StepSums
from epochal.parallel.context_parallel import first_token_hook, head_inputs_hook, keep_chunks
from epochal.parallel.context_parallel import gather_sequence as gather_context

__all__ = [
    "KeyedHeadAttention",
    "PositionDropout",
    "canonical_refusal",
    "install_canonical",
]

_COLUMN = ("attention.wq", "attention.wk", "attention.wv", "mlp.fc1", "mlp.w1", "mlp.w3")
_ROW = ("attention.wo", "mlp.fc2", "mlp.w2")
#: a T5 decoder block's cross-attention (keys and values from the encoder's output)
_CROSS_COLUMN = ("cross_attention.wq", "cross_attention.wk", "cross_attention.wv")
_CROSS_ROW = ("cross_attention.wo",)
#: a dense MLP's (and an expert's) column and row linears
_MLP_COLUMN = ("fc1", "w1", "w3")
_MLP_ROW = ("fc2", "w2")


def canonical_refusal(
    config: ModelConfig,
    degree: int,
    *,
    tp: int = 1,
    cp: int = 1,
    seq_length: int | None = None,
    sequence_parallel: bool = False,
    context_degree: int = 1,
    packed: bool = False,
    decoder_seq_length: int | None = None,
) -> str | None:
    """Why the canonical units cannot hold for this model and layout, or None when they do.

    Args:
        config: the model config.
        degree: ``parallel.invariant_degree`` (1: off).
        tp, cp: the tensor- and context-parallel sizes (every pipeline size holds).
        seq_length: the training sequence length (None: not checked).
        sequence_parallel: sequence parallelism is on.
        context_degree: ``parallel.invariant_context_degree``.
        packed: rows of packed sequences (``data.pack_sequences``; their lengths padded
            to the token sums' chunks, :meth:`~epochal.parallel.config.ParallelConfig.packed_row_multiple`).
        decoder_seq_length: a T5 model's decoder length (``data.seq_length_decoder``;
            None: not checked).
    """
    if degree <= 1:
        return "parallel.invariant_degree is 1"
    if degree & (degree - 1):
        return f"parallel.invariant_degree={degree} is not a power of two"
    for name, size in (("tensor_parallel", tp), ("context_parallel", cp)):
        if degree % size:
            return f"parallel.invariant_degree={degree} is not a multiple of {name}={size}"
    if context_degree % cp:
        return (
            f"context_parallel={cp} does not divide parallel.invariant_context_degree="
            f"{context_degree} (the weight gradients' sequence chunks of this run)"
        )
    if config.type not in ("gpt", "bert", "esm", "t5"):
        return f"model.type={config.type!r} (the canonical units cover GPT, BERT, ESM-2 and T5)"
    if config.type == "t5":
        if cp > 1:
            return "context parallelism for T5 models"
        if sequence_parallel and tp > 1:
            return "sequence parallelism for T5 models"
    if config.bert_binary_head and cp > 1 and packed:
        return "the BERT binary head on packed rows under context parallelism"
    if config.num_experts:
        if config.add_bias_linear:
            return "mixture-of-experts layers with biases (model.add_bias_linear)"
        if config.moe_grouped_gemm:
            return "grouped expert GEMMs (model.moe_grouped_gemm: one product for all experts)"
    if config.head != "mlm" and cp > 1 and (packed or config.type == "gpt"):
        where = "on packed rows" if packed else "of a GPT model"
        return f"a fine-tuning head {where} under context parallelism"
    if config.num_kv_heads % (tp * cp) or config.num_attention_heads % (tp * cp):
        return (
            f"model.num_attention_heads={config.num_attention_heads} and "
            f"model.num_query_groups={config.num_kv_heads} do not both split over "
            f"tensor_parallel x context_parallel = {tp * cp} (replicated key/value "
            "projections, or the head exchange of context parallelism)"
        )
    if sequence_parallel and tp * cp > 2 * degree:
        return (
            f"tensor_parallel x context_parallel = {tp * cp} under sequence parallelism "
            f"exceeds the 2 * parallel.invariant_degree = {2 * degree} sequence chunks"
        )
    if config.attention_dropout > 0 and (
        config.position_embedding_type == "alibi" or config.sliding_window
    ):
        return "attention dropout with ALiBi or a sliding window"
    widths = {
        "model.hidden_size": config.hidden_size,
        "the MLP width (model.ffn_hidden_size)": config.ffn_size,
        "the key/value width": config.num_kv_heads * config.head_dim,
        "the query width": config.num_attention_heads * config.head_dim,
        "the padded vocabulary": config.padded_vocab_size,
    }
    if config.num_experts:
        widths["the experts' width (model.moe_ffn_hidden_size)"] = config.moe_ffn_size
        shared = config.moe_shared_expert_intermediate_size
        if shared is not None:
            widths["model.moe_shared_expert_intermediate_size"] = shared
    for name, width in widths.items():
        if width % degree:
            return f"{name} ({width}) does not split into parallel.invariant_degree={degree} chunks"
    chunks = 2 * max(degree, context_degree)
    lengths = {"data.seq_length": seq_length, "data.seq_length_decoder": decoder_seq_length}
    for name, length in lengths.items():
        if length is not None and length % chunks:
            return (
                f"{name} ({length}) does not split into {chunks} sequence chunks "
                "(2 * parallel.invariant_degree and 2 * parallel.invariant_context_degree)"
            )
    return None


def _expert_mlps(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """A mixture-of-experts block's dense MLPs by their names in ``block.mlp``, or none.

    Its routed experts (this rank's, under expert parallelism) and its shared expert;
    each runs as the dense MLP does in canonical units, its output whole.
    """
    mlp = block.mlp
    if not isinstance(mlp, MoEMLP):
        return []
    out = [(f"experts.{name}", expert) for name, expert in mlp.experts.named_children()]
    if mlp.shared_expert is not None:
        out.append(("shared_expert", mlp.shared_expert))
    return out


def _install_expert_mlps(block: nn.Module, red: Reductions) -> None:
    """Canonical units for a mixture-of-experts block's MLPs.

    Each expert's weight gradient is one product over the tokens routed to it (their
    number is no multiple of anything: the units of the experts have ``C = 1`` and no
    context group); its row-parallel product's sum is the tree over the group, so the
    layer's output is whole on every tensor-parallel rank.
    """
    units = Reductions(red.degree, red.group, None, 1)
    for _, mlp in _expert_mlps(block):
        _install(mlp, _mlp_forward, units)
        for name in _MLP_COLUMN:
            if mlp._modules.get(name) is not None:
                _column(mlp._modules[name], units, gather=False)
        for name in _MLP_ROW:
            if mlp._modules.get(name) is not None:
                _row(mlp._modules[name], units, scatter=False)


def _whole_sequence_moe(moe: nn.Module, red: Reductions, sp: bool) -> None:
    """A mixture-of-experts layer computed on the whole sequence on every rank, then sliced.

    Under sequence parallelism its input is gathered over the tensor-parallel group first
    (the block's pre-hook), under context parallelism then over the context-parallel group;
    every rank routes every token and runs every expert (its weight gradients whole on
    every rank: no context-parallel sum), and keeps its chunks and slice of the output.
    """
    if red.cp is not None:
        group = red.cp.group
        moe.register_forward_pre_hook(
            lambda module, args: (gather_context(args[0], group, 1), *args[1:])
        )
        moe.register_forward_hook(lambda module, args, out: keep_chunks(out, group))
    if sp:
        moe.register_forward_hook(lambda module, args, out: keep_sequence_slice(out, red))


def _linear(block: nn.Module, name: str) -> nn.Module | None:
    """The block's linear at ``name`` (``"attention.wq"``), None where the block has none."""
    parent, child = name.split(".")
    owner = block._modules.get(parent)
    return None if owner is None else owner._modules.get(child)


def _local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _take(module: nn.Module, name: str) -> tuple[torch.Tensor | None, Any]:
    """``(tensor, complete)`` of the module's parameter ``name`` for a canonical op.

    A weight summed once per step goes through the part's
    :class:`~epochal.parallel.canonical_step_sum.StepSums`; others through its
    :class:`~epochal.parallel.canonical_deferred.DeferredCompletion` where it has one
    (the op then leaves the context-parallel completion to it).
    """
    param = getattr(module, name, None)  # RMSNorm has no bias at all
    step_sums = module.__dict__.get("canonical_step_sums")
    if step_sums is not None and name == "weight" and param is not None:
        return step_sums.take(module, param)
    deferred = module.__dict__.get("canonical_deferred")
    if deferred is None:
        return _local(param), True
    return deferred.take(param)


def _install(module: nn.Module, forward: Any, red: Reductions, **options: bool) -> None:
    """Make ``forward(module, x)`` the module's forward, its state kept on the module.

    A bound method (not a closure) so that a copy of the model (``copy.deepcopy``)
    computes with the copy's own parameters.
    """
    module.canonical_reductions = red
    module.canonical_options = options
    module.forward = types.MethodType(forward, module)


def _column_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    red, gather = self.canonical_reductions, self.canonical_options["gather"]
    if gather:
        x = gather_sequence(x, red)
    after = self.canonical_options["after_gather"]
    (weight, cw), (bias, cb) = _take(self, "weight"), _take(self, "bias")
    return column_linear(
        x, weight, bias, red, gathered=after or (gather and red.size > 1), complete=(cw, cb)
    )


def _column(module: nn.Linear, red: Reductions, *, gather: bool) -> None:
    _install(module, _column_forward, red, gather=gather, after_gather=False)


def _column_after_gather(module: nn.Linear, red: Reductions) -> None:
    """A column linear reading a gathered input: its input gradient is reduce-scattered and padded."""
    _install(module, _column_forward, red, gather=False, after_gather=True)


def _row_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    red, scatter = self.canonical_reductions, self.canonical_options["scatter"]
    weight, cw = _take(self, "weight")
    out = row_linear(x, weight, red, scatter=scatter, complete=cw)
    if self.bias is None:
        return out
    bias, cb = _take(self, "bias")
    return scale_shift(out, None, bias, red, sharded=scatter, complete=(True, cb))


def _row(module: nn.Linear, red: Reductions, *, scatter: bool) -> None:
    _install(module, _row_forward, red, scatter=scatter)


def _normalized(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` normalized without the norm's affine step (RMSNorm's or LayerNorm's)."""
    if isinstance(norm, nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, None, norm.eps)
    return F.layer_norm(x, norm.normalized_shape, None, None, norm.eps)


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    red, sharded = self.canonical_reductions, self.canonical_options["sharded"]
    (weight, cw), (bias, cb) = _take(self, "weight"), _take(self, "bias")
    return scale_shift(_normalized(self, x), weight, bias, red, sharded=sharded, complete=(cw, cb))


def _norm(norm: nn.Module, red: Reductions, *, sharded: bool) -> None:
    _install(norm, _norm_forward, red, sharded=sharded)


def _head_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """QK-norm over ``[b, s, heads_local, head_dim]``: its weight shared by every head."""
    bias = _local(getattr(self, "bias", None))  # RMSNorm has no bias at all
    return head_scale_shift(
        _normalized(self, x), _local(self.weight), bias, self.canonical_reductions
    )


#: each activation's function of the pre-activation (the MLP's own formulas)
def _per_chunk(fn: Any, t: torch.Tensor, chunks: int) -> torch.Tensor:
    """``fn`` applied to each of ``t``'s ``chunks`` last-dimension chunks on its own.

    A vectorized activation computes a tensor's last, partial vector by another
    path (other bits for ``exp``/``tanh``/``erf``), and where that tail falls depends
    on the tensor's size; each chunk has the same shape on every layout, so its
    elements take the same path everywhere.
    """
    if chunks == 1:
        return fn(t)
    return torch.cat([fn(piece.contiguous()) for piece in t.chunk(chunks, -1)], -1)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The MLP with its activation computed per canonical chunk (``[..., hidden]`` in and out)."""
    chunks = self.canonical_reductions.local
    act = ACTIVATION_FUNCTIONS[self.activation]
    if self.activation in GATED_ACTIVATIONS:
        return self.w2(_per_chunk(act, self.w1(x), chunks) * self.w3(x))
    return self.fc2(_per_chunk(act, self.fc1(x), chunks))


class PositionDropout(nn.Module):
    """Dropout whose mask is drawn for the whole sequence; this rank keeps its positions' rows of dimension 1.

    Args:
        p: the drop probability.
        rank, size: this rank's slice of ``size`` along its context-parallel
            rank's sequence (0 and 1: all of it; sequence parallelism).
        cp_rank, cp_size: the context-parallel rank holding chunks ``cp_rank`` and
            ``2 cp_size - 1 - cp_rank`` of the sequence (0 and 1: the whole).
    """

    def __init__(
        self, p: float, rank: int = 0, size: int = 1, cp_rank: int = 0, cp_size: int = 1
    ) -> None:
        super().__init__()
        self.p, self.rank, self.size = p, rank, size
        self.cp_rank, self.cp_size = cp_rank, cp_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        s = x.shape[1]
        whole = (x.shape[0], s * self.size * self.cp_size, *x.shape[2:])
        noise = torch.empty(whole, dtype=x.dtype, device=x.device).bernoulli_(1 - self.p)
        noise.div_(1 - self.p)
        if self.cp_size == 1:
            return x * noise.narrow(1, self.rank * s, s)
        from epochal.parallel.context_parallel import chunk_positions

        held = chunk_positions(whole[1], self.cp_size, self.cp_rank, x.device)
        return x * noise.index_select(1, held[self.rank * s : (self.rank + 1) * s])

    def extra_repr(self) -> str:
        return f"p={self.p}, slice={self.rank}/{self.size}, cp={self.cp_rank}/{self.cp_size}"


class KeyedHeadAttention:
    """Core attention (the model's ``core_attention`` seam) whose dropout is drawn per global head.

    Head ``j`` of this rank is global head ``first_head + j``; its mask comes from a
    generator seeded by ``derive_seed(torch.initial_seed(), global head)`` (the
    block's keyed stream, :mod:`epochal.parallel.dropout_keys`), so a head draws the
    same mask on every layout. Without dropout the call is PyTorch's
    ``scaled_dot_product_attention`` over the key/value heads repeated per query head.

    Args:
        first_head: the global index of this rank's first query head.
    """

    #: T5's relative bias (``[1 or b, heads, s, s_k]``, this rank's heads) is added to the scores
    takes_position_bias = True

    def __init__(self, first_head: int) -> None:
        self.first_head = first_head

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        attention_mask: torch.Tensor | None,
        dropout_p: float,
        scale: float | None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, heads, s, hd = q.shape
        if k.shape[1] != heads:
            k = k.repeat_interleave(heads // k.shape[1], dim=1)
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        masked_out = attention_mask
        if causal:
            future = torch.ones(s, k.shape[2], dtype=torch.bool, device=q.device).triu(1)
            masked_out = future if masked_out is None else masked_out | future
        if dropout_p == 0:
            mask = None if masked_out is None else ~masked_out
            if position_bias is not None:
                mask = position_bias
                if masked_out is not None:
                    mask = position_bias.masked_fill(masked_out, float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        s_k = k.shape[2]
        # one [s, hd] x [hd, s_k] product per (sample, head), on contiguous copies: the
        # call is the same whatever the number of heads (a lone head's view is otherwise
        # taken as contiguous and multiplied by another path)
        q3 = q.contiguous().view(b * heads, s, hd)
        k3 = k.contiguous().view(b * heads, s_k, hd)
        scores = torch.bmm(q3, k3.transpose(1, 2)).view(b, heads, s, s_k) * (
            scale if scale is not None else 1.0 / math.sqrt(hd)
        )
        if position_bias is not None:
            scores = scores + position_bias
        if masked_out is not None:
            scores = scores.masked_fill(masked_out, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        seed = torch.initial_seed()
        keep = torch.empty((b, heads, s, s_k), dtype=torch.bool, device=q.device)
        for j in range(heads):
            generator = torch.Generator(device=q.device)
            generator.manual_seed(derive_seed(seed, self.first_head + j) >> 1)
            draw = torch.empty((b, s, s_k), dtype=q.dtype, device=q.device)
            keep[:, j] = draw.bernoulli_(1 - dropout_p, generator=generator).bool()
        out = _DroppedValues.apply(
            probs.view(b * heads, s, s_k),
            keep.view(b * heads, s, s_k),
            1.0 / (1 - dropout_p),
            v.contiguous().view(b * heads, s_k, hd),
        )
        return out.view(b, heads, s, hd)


class _DroppedValues(torch.autograd.Function):
    """``dropout(probs) @ v`` keeping ``probs`` and a boolean mask, not the dropped product.

    Shapes: ``probs`` and ``keep`` ``[B, s, s_k]``, ``v`` ``[B, s_k, hd]`` -> ``[B, s, hd]``;
    the dropped probabilities ``where(keep, probs * scale, 0)`` are made again in the
    backward (a quarter of a float mask's memory, and no third copy kept).
    """

    @staticmethod
    def forward(
        ctx: Any, probs: torch.Tensor, keep: torch.Tensor, scale: float, v: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(probs, keep, v)
        ctx.scale = scale
        return torch.bmm(torch.where(keep, probs * scale, 0.0), v)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        probs, keep, v = ctx.saved_tensors
        grad_probs = grad_v = None
        if ctx.needs_input_grad[0]:
            grad_probs = torch.where(keep, torch.bmm(grad, v.transpose(1, 2)) * ctx.scale, 0.0)
        if ctx.needs_input_grad[3]:
            dropped = torch.where(keep, probs * ctx.scale, 0.0)
            grad_v = torch.bmm(dropped.transpose(1, 2), grad)
        return grad_probs, None, None, grad_v


class _ShardOnly(ParallelStyle):
    """Place a linear's parameters as a column- or row-parallel style does, with no hooks."""

    def __init__(self, style: ColwiseParallel | RowwiseParallel) -> None:
        super().__init__()
        self.style = style

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, nn.Embedding):  # rows: the vocabulary (RowwiseParallel's)
            self.style._partition_embedding_fn("", module, device_mesh)
        else:
            self.style._partition_linear_fn("", module, device_mesh)
        return module


def _shard_parameters(model: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Tensor-parallel placements: column/row weights, vocabulary-parallel embedding rows and bias."""
    from epochal.parallel.tensor_parallel import parallelize_keeping_ties

    plan: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        plan["tok_embeddings"] = _ShardOnly(RowwiseParallel())
    if model.output is not None:
        plan["output"] = _ShardOnly(ColwiseParallel())
    for key, block in model.layers.items():
        for name in _COLUMN + _CROSS_COLUMN + _ROW + _CROSS_ROW:
            if _linear(block, name) is not None:
                column = name in _COLUMN or name in _CROSS_COLUMN
                style = ColwiseParallel() if column else RowwiseParallel()
                plan[f"layers.{key}.{name}"] = _ShardOnly(style)
        for prefix, mlp in _expert_mlps(block):
            for name in _MLP_COLUMN + _MLP_ROW:
                if mlp._modules.get(name) is not None:
                    style = ColwiseParallel() if name in _MLP_COLUMN else RowwiseParallel()
                    plan[f"layers.{key}.mlp.{prefix}.{name}"] = _ShardOnly(style)
    parallelize_keeping_ties(model, tp_mesh, plan)
    head = getattr(model, "lm_head", None)
    if head is not None:  # the decoder's bias [V]: sharded like the output's rows
        bias = distribute_tensor(head.bias.data, tp_mesh, [Shard(0)])
        head.register_parameter("bias", nn.Parameter(bias, requires_grad=head.bias.requires_grad))


def _add_bias(self: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """BERT's ``lm_head.add_bias`` in canonical units (the logits whole or this rank's shard)."""
    bias = self.bias
    if logits.shape[-1] != _local(bias).shape[0]:  # gathered over the vocabulary
        bias = bias.full_tensor() if isinstance(bias, DTensor) else bias
    else:
        bias = _local(bias)
    red = self.canonical_reductions
    return add_vocabulary_bias(logits, bias, red, self.canonical_options["vocab"])


def _install_encoder_top(model: nn.Module, red: Reductions, sp: bool) -> None:
    """BERT / ESM-2's parts outside the blocks: token types, the embedding norm, the heads.

    The head's ``dense`` is replicated on every tensor-parallel rank (Megatron's), so it
    computes in units of its own without the tensor-parallel group; the decoder's bias
    (``lm_head.bias``, vocabulary-sharded) gets its gradient in canonical vocabulary chunks.
    Under sequence parallelism (``sp``) the embedding stage runs whole on every rank
    (ESM-2's token dropout counts each sequence's masks) and keeps this rank's slice
    after its dropout; the heads (masked-LM, pooler, fine-tuning) read the gathered
    sequence. Under context parallelism the pooler reads the first token from
    context-parallel rank 0 (its chunk 0), so every rank pools the same token and
    computes the binary head's whole gradient; a fine-tuning head reads the gathered
    sequence (:func:`~epochal.parallel.context_parallel.head_inputs_hook`).
    """
    if sp:
        if model.tok_embeddings is not None:
            model.embedding_dropout.register_forward_hook(
                lambda module, args, out: keep_sequence_slice(out, red)
            )
        for name in ("lm_head", "pooler", "head"):
            if model._modules.get(name) is not None:
                model._modules[name].register_forward_pre_hook(_gather_first(red))
    if red.cp is not None and model._modules.get("pooler") is not None:
        model.pooler.register_forward_pre_hook(first_token_hook(red.cp.group))
    if red.cp is not None and model._modules.get("head") is not None:
        model.head.register_forward_pre_hook(head_inputs_hook(red.cp.group))
    if getattr(model, "tokentype_embeddings", None) is not None:
        install_canonical_embedding(
            model.tokentype_embeddings, red, vocab_parallel=False, sequence_parallel=False
        )
    if getattr(model, "embedding_norm", None) is not None:
        _norm(model.embedding_norm, red, sharded=False)
    head = getattr(model, "lm_head", None)
    if head is None:
        return
    cp_group = red.cp.group if red.cp is not None else None
    _column(head.dense, Reductions(red.degree, None, cp_group, red.context_degree), gather=False)
    _norm(head.norm, red, sharded=False)
    head.canonical_reductions = red
    head.canonical_options = {"vocab": model.config.padded_vocab_size}
    head.add_bias = types.MethodType(_add_bias, head)


def install_canonical(
    model: nn.Module,
    degree: int,
    tp_mesh: DeviceMesh | None = None,
    *,
    sequence_parallel: bool = False,
    gather_logits: bool = False,
    training: bool = True,
    cp_group: Any = None,
    context_degree: int = 1,
    packed_row: Callable[[], PackedSequences | None] | None = None,
    defer_completion: bool = False,
    step_sums: bool = False,
) -> Reductions:
    """Compute ``model`` (a GPT model or stage) in canonical units, sharded over ``tp_mesh`` if given.

    Call it on a materialized, initialized model (every rank with the same values)
    that :func:`canonical_refusal` accepts, before activation recompute, keyed
    dropout and data parallelism wrap it.

    Args:
        model: the model or stage (``tok_embeddings``/``norm``/``output`` may be None).
        degree: the invariance degree ``D``.
        tp_mesh: the 1-D tensor-parallel mesh, or None for one rank.
        sequence_parallel: shard the residual stream over the sequence between the
            tensor-parallel regions.
        gather_logits: return the whole vocabulary's logits on every rank (a copy;
            without it each rank keeps its vocabulary shard ``[b, s, V / n]``).
        training: draw attention dropout per global head (:class:`KeyedHeadAttention`);
            False for inference (generation with a KV cache, which that seam does not take).
        cp_group: the context-parallel group (None without): attention exchanges
            heads (:class:`~epochal.parallel.canonical_context.HeadExchangeAttention`)
            and token sums complete their tree over it.
        context_degree: ``parallel.invariant_context_degree`` (the weight
            gradients' sequence chunks; a multiple of the context-parallel size).
        packed_row: under context parallelism, the sequences of the packed row being
            computed (:meth:`~epochal.parallel.context_parallel.ContextParallel.packed_row`):
            BERT / ESM-2's exchanged heads attend within each, as one process does.
        defer_completion: under context parallelism, complete the linears' and norms'
            weight gradients once per micro-batch after its backward
            (:mod:`~epochal.parallel.canonical_deferred`: the same bits, fewer waits);
            not with a data-parallel wrapper, which expects them in each unit's backward.
        step_sums: ``parallel.invariant_context_accumulation == "step"``: the linears'
            weight gradients add their sequence chunks' sums over the step's
            micro-batches leaf by leaf and complete once per step
            (:mod:`~epochal.parallel.canonical_step_sum`; the part's
            ``canonical_step_sums``, finished by the step).

    Returns:
        The :class:`~epochal.parallel.canonical.Reductions` the model computes with.
    """
    tp = tp_mesh.size() if tp_mesh is not None else 1
    red = Reductions(degree, tp_mesh.get_group() if tp > 1 else None, cp_group, context_degree)
    sp = sequence_parallel and tp > 1
    if tp > 1:
        assert tp_mesh is not None
        _shard_parameters(model, tp_mesh)
    config: ModelConfig = model.config
    heads_per_rank = config.num_attention_heads // tp
    group_heads = heads_per_rank // red.cp_size  # a rank's heads after the head exchange
    first_head = red.rank * heads_per_rank + red.cp_rank * group_heads
    slices = {"rank": red.rank if sp else 0, "size": tp if sp else 1}
    slices.update(cp_rank=red.cp_rank, cp_size=red.cp_size)
    for block in model.layers.values():
        for name in ("attention_norm", "cross_attention_norm", "ffn_norm"):
            if block._modules.get(name) is not None:
                _norm(block._modules[name], red, sharded=sp)
        if not isinstance(block.mlp, MoEMLP):
            _install(block.mlp, _mlp_forward, red)
        for name in _COLUMN + _CROSS_COLUMN:
            module = _linear(block, name)
            if module is not None:
                _column(module, red, gather=False)
        for name in _ROW + _CROSS_ROW:
            module = _linear(block, name)
            if module is not None:
                _row(module, red, scatter=sp)
        for name in ("q_layernorm", "k_layernorm"):
            if block.attention._modules.get(name) is not None:
                _install(block.attention._modules[name], _head_norm_forward, red)
        cross = block._modules.get("cross_attention")
        if cross is not None and training and config.attention_dropout > 0:
            # the cross-attention's heads draw after the self-attention's: streams of their own
            cross.core_attention = KeyedHeadAttention(first_head + config.num_attention_heads)
        if sp:
            for name in ("attention", "mlp"):
                getattr(block, name).register_forward_pre_hook(_gather_first(red))
            for name in _COLUMN:
                module = _linear(block, name)
                if module is not None:
                    _column_after_gather(module, red)
        else:
            # the linears' input gradients are added up first, then (a post-LN block's
            # input also feeds the residual) the residual's, as the gather groups them
            # under sequence parallelism
            for name in ("attention", "mlp"):
                getattr(block, name).register_forward_pre_hook(_group_first)
        if isinstance(block.mlp, MoEMLP):  # after the block's gather (sequence parallelism)
            _install_expert_mlps(block, red)
            _whole_sequence_moe(block.mlp, red, sp)
        block.dropout = PositionDropout(block.dropout.p, **slices)
        core = None
        if training and config.attention_dropout > 0:
            core = KeyedHeadAttention(first_head)
        if red.cp is not None:
            core = HeadExchangeAttention(red.cp.group, block.attention, core, packed_row)
        if core is not None:
            block.attention.core_attention = core
        if block.attention.use_alibi and tp > 1:  # this rank's heads' slopes
            first = red.rank * heads_per_rank
            block.attention.alibi_heads = slice(first, first + heads_per_rank)
            block.attention.init_buffers()
    if tp > 1 and getattr(model, "encoder_relative_bias", None) is not None:
        # T5's tables whole on every rank, each self-attention its heads' slice
        from epochal.parallel.tensor_parallel import share_relative_bias

        share_relative_bias(model, tp_mesh, False)
    encoder = config.type in ("bert", "esm")
    embed_sp = sp and not encoder  # an encoder's embedding stage runs whole
    if model.tok_embeddings is not None:
        install_canonical_embedding(
            model.tok_embeddings, red, vocab_parallel=tp > 1, sequence_parallel=embed_sp
        )
        whole = {**slices, "rank": 0, "size": 1}
        model.embedding_dropout = PositionDropout(
            model.embedding_dropout.p, **(slices if embed_sp else whole)
        )
    if model.pos_embeddings is not None:
        install_canonical_embedding(
            model.pos_embeddings, red, vocab_parallel=False, sequence_parallel=embed_sp
        )
    if encoder:
        _install_encoder_top(model, red, sp)
    for name in ("norm", "encoder_norm", "decoder_norm"):
        if model._modules.get(name) is not None:
            _norm(model._modules[name], red, sharded=sp)
    if model.output is not None:  # an encoder's head gathered the sequence already
        _column(model.output, red, gather=sp and not encoder)
        if gather_logits and tp > 1:
            model.output.register_forward_hook(_gather_vocabulary(red))
    if sp and model.tok_embeddings is None:
        from epochal.parallel.tensor_parallel import full_sequence_positions

        model.register_forward_pre_hook(full_sequence_positions(tp), with_kwargs=True)
    leaves = max(red.weight_chunks // 2, 1)
    summed = _sum_per_step(model, red, leaves) if step_sums and (leaves > 1 or red.cp) else set()
    if defer_completion and red.cp is not None:
        _defer_completions(model, red.cp, summed)
    model.canonical_reductions = red
    model.train(model.training)  # the new modules (dropout by position) take the model's mode
    return red


def _shared(model: nn.Module) -> set[int]:
    """Ids of the parameters that several modules of ``model`` use, and a tied output head's."""
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[id(param)] = uses.get(id(param), 0) + 1
    shared = {key for key, n in uses.items() if n > 1}
    config = getattr(model, "config", None)
    if config is not None and config.tie_embeddings and model._modules.get("output") is not None:
        shared.add(id(model.output.weight))  # a pipeline's last stage holds one copy of two uses
    return shared


def _sum_per_step(model: nn.Module, red: Reductions, leaves: int) -> set[int]:
    """The linears' weights that sum their chunks over the step (``step_sums``); their ids."""
    sums, summed, shared = StepSums(red.cp, leaves), set(), _shared(model)
    # the transformer blocks' linears and the output layer (a fine-tuning head, which
    # reads the gathered sequence, completes per micro-batch)
    blocks = [m for block in model.layers.values() for m in block.modules()]
    output = model._modules.get("output")
    for module in [*blocks, *([output] if output is not None else [])]:
        own = module.__dict__.get("canonical_reductions")
        method = module.__dict__.get("forward")
        if own is not red or getattr(method, "__func__", None) not in (
            _column_forward,
            _row_forward,
        ):
            continue  # not a canonical linear, or one in units of its own (experts)
        weight = module._parameters.get("weight")
        if weight is not None and id(weight) not in shared and sums.register(module):
            module.canonical_step_sums = sums
            summed.add(id(weight))
    if summed:
        model.canonical_step_sums = sums
    return summed


def _defer_completions(model: nn.Module, cp: Reductions, summed: set[int]) -> None:
    """The linears' and norms' context-parallel completions through one node per forward (``defer_completion``)."""
    deferred = DeferredCompletion(cp)
    shared = _shared(model) | summed
    forwards = (_column_forward, _row_forward, _norm_forward)
    for module in model.modules():
        red = module.__dict__.get("canonical_reductions")
        method = module.__dict__.get("forward")
        if red is None or red.cp is None or getattr(method, "__func__", None) not in forwards:
            continue  # not a canonical linear or norm, or one without the context group (experts)
        deferred.register(module, "weight", "bias", shared=shared)
        module.canonical_deferred = deferred
    model.register_forward_pre_hook(deferred.open)


def _gather_vocabulary(red: Reductions) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return _GatherLast.apply(output, red)

    return hook


class _GatherLast(torch.autograd.Function):
    """Every rank's shard of the last dimension joined in rank order; the backward keeps this rank's."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, red: Reductions) -> torch.Tensor:
        ctx.red, ctx.width = red, local.shape[-1]
        moved = sequence_all_gather(local.movedim(-1, 1).contiguous(), 1, red)
        return moved.movedim(1, -1).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        w, r = ctx.width, ctx.red.rank
        return grad[..., r * w : (r + 1) * w].contiguous(), None


def _group_first(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The first input through a view of its own: its consumers' gradients add up there first."""
    return (args[0].view_as(args[0]), *args[1:])


def _gather_first(red: Reductions) -> Any:
    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (gather_sequence(args[0], red), *args[1:])

    return hook
