"""Context parallelism: every sequence split over ``cp`` ranks (Megatron's ``--context-parallel-size``).

Chunking (Megatron's load balancing for causal attention): a sequence of ``S``
tokens is cut into ``2 * cp`` chunks of ``c = S / (2 * cp)`` tokens, and
context-parallel rank ``r`` holds chunks ``r`` and ``2 * cp - 1 - r``, back to
back (``2 * c`` tokens). Under causal attention the early chunk has little to
attend to and the late one much, so every rank does the same work. Tokens,
labels, loss masks, token types, padding masks and position ids are cut the same
way; position ids are those of the global sequence, so RoPE and learned absolute
positions are unchanged.

Attention (the seam :attr:`epochal.model.layers.attention.Attention.core_attention`,
replaced from outside by :func:`apply_context_parallel`; the model stays free of
collectives): each rank all-gathers the keys and values of the other ranks over
the context-parallel group and computes its own queries against the keys in one
exact softmax per chunk: causal (GPT), chunk ``j`` against keys ``[0, (j + 1) c)``
under a lower-right causal mask (so rank r's early chunk skips the keys it cannot
see); bidirectional (BERT, ESM-2) against all ``S`` keys with the gathered padding
mask. The gather's backward sums each rank's key/value gradients over the group
(reduce-scatter on NCCL; all-reduce then slice on gloo, which has no
reduce-scatter). All-gather rather than a ring of send/receive: it is exact
with PyTorch's own kernels on every device (one SDPA call per chunk, no
hand-written online-softmax merge), it composes with autograd in a few lines, and it is
Megatron-Core's ``--cp-comm-type allgather``; its cost is that each rank holds
the whole sequence's keys and values of one layer at a time (``2 * S * kv_heads
* head_dim`` per sample), while queries, logits, MLP and norm activations fall to
``1/cp``. A ring (Megatron's ``p2p``) would hold only ``2/cp`` of them.
``parallel.context_parallel_exchange = "a2a"`` exchanges heads instead (DeepSpeed-
Ulysses, Megatron-Core's ``a2a``; :mod:`epochal.parallel.canonical_context`): each rank
attends with ``heads / cp`` whole heads over the whole sequence, so the keys and values
it holds fall as ``1/cp`` too, and each head is the kernel call one process makes for it;
it needs a tensor-parallel rank's query and key/value heads to split over the group.

Loss: the train step receives the whole micro-batch (every rank of a
context-parallel group reads the same samples, as tensor-parallel ranks do). The
wrapped model (:class:`ContextParallel` inside
:class:`~epochal.parallel.step_model.StepModel`) cuts the inputs, runs the local
chunks and gathers the per-token losses back into global order ``[b, S]`` (a
gather whose backward keeps each rank's own slice: every rank computes the same
loss from the same values). The step's token mean is therefore the global one
(sum of token losses / global token count), identical on every context-parallel
rank. Called without labels, the model returns the gathered output (evaluation
metrics on whole logits).

Gradients: every rank's weight gradients hold its tokens' contributions; they are
summed over the context-parallel group once per step (:meth:`ContextParallel.
reduce_grads`, one all-reduce of a flat buffer; like data parallelism, CP does
not shard weights). The data-parallel reduction (averaging) is unchanged.

Supported: GPT (causal) and BERT / ESM-2 (bidirectional, padded batches; ESM-2's
token dropout counts each sequence's masked tokens on the whole sequence before the
cut and passes the model this rank's slice of the ratios, ``mask_ratio``), with
data parallelism (any ``dp_sharding``), tensor and sequence parallelism (each
tensor-parallel rank gathers its heads' keys and values over its own
context-parallel group), recompute (full and selective: a recomputed layer gathers
its keys and values again, in the same order on every rank) and pipeline
parallelism. T5 (learned positions): each stack is cut into chunks of its own length
(:meth:`ContextParallel._cut_stacks`), the self-attentions exchange as above and each
cross-attention reads every rank's chunks of the encoder output
(:meth:`ContextParallel.attention` without a causal mask, whose keys, of another length,
are gathered as any; the head exchange's own with ``a2a``).
Refused by name (:func:`check_context_parallel`,
:meth:`ContextParallel.check_training`): T5's relative bias, ALiBi and sliding windows except with the
exchange of heads (``a2a``, whose ranks attend over the whole sequence), fine-tuning heads outside the
canonical units (in them the head reads the gathered sequence, :func:`head_inputs_hook`),
and a custom ``loss_fn`` (it would see local logits). The
BERT binary head pools the first token from context-parallel rank 0, which holds it
(:func:`first_token_hook`; padded batches: on packed rows it is refused).

Packed rows: GPT rows of several documents (a per-document ``attention_mask``
``[b, 1, S, S]`` and ``position_ids``, ``data.reset_attention_mask``) and packed
BERT / ESM-2 rows (THD: ``[1, T]`` with ``cu_seqlens``, ``data.pack_sequences``).
The whole row is cut into ``2 * cp`` chunks like any sequence (not each document,
as Megatron-Core's THD path does): this rank's query rows of the document mask
over all keys in global order go to the attention seam (packed rows: built from
``cu_seqlens`` by :func:`packed_document_mask`, ``[1, 1, L, T]`` bool), and the
position ids are the per-document ones of the whole row, cut with the tokens. Why
the whole row: it is exact for any packing and pads only the row to a multiple of
``2 * cp`` (at most ``2 * cp - 1`` loss-free tokens;
:meth:`~epochal.parallel.config.ParallelConfig.packed_row_multiple`), where the
per-document cut pads every document to a multiple of ``2 * cp``; its load balance
is the same as the per-document cut's here, because each chunk is computed as one
dense masked block (the work per rank is that of an unpacked row: masked scores
are computed and dropped, as for any mask). The per-document cut pays off only
with a variable-length kernel that skips masked blocks. The mask costs ``L * T``
bools per rank (``1/cp`` of the row's), built once per micro-batch and shared by
every layer.

Pipeline parallelism: every stage holds this rank's chunks; the schedule hands
the stages whole ``[b, S]`` micro-batches (tokens, keyword inputs) and
:meth:`ContextParallel.install_stage_hook` cuts them on the way into each stage
(a stage after the first gets ``[b, L, hidden]`` hidden states, ``S = L * cp``);
stages send and receive the local ``[b, L, hidden]`` activations. The last
stage's losses are gathered to ``[b, S]`` as without pipelining.

In canonical units (``training.layout_invariant`` with ``parallel.invariant_degree``,
GPT models) the run computes the bits of one process instead: attention exchanges
heads (:mod:`epochal.parallel.canonical_context`, not this module's all-gather), every
sum over tokens runs in folded sequence chunks completed over the group inside the
backward pass (:mod:`epochal.parallel.canonical`), so :meth:`ContextParallel.reduce_grads`
is not called, and dropout keys are not folded with the rank (each rank keeps its
positions of the whole sequence's mask). The cutting of inputs and the gathering of
losses below are the same.

The exact gradient synchronisation: every rank accumulates its gradients in the global
micro-batch order over its data-parallel group (the ranks with its
context-parallel coordinate), then the sums are summed over the chunks; so with
``context_parallel`` fixed, data-parallel and accumulation changes stay
bit-identical, while changing ``context_parallel`` changes the sums (like
``tensor_parallel``; within 1e-5 of one process). The exact gradient norm counts
each replicated gradient once (context-parallel rank 0); keyed dropout seeds get
the rank folded in (:func:`context_seed`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.data.epochs.permutation import derive_seed
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.layers.packing import PackedSequences

__all__ = [
    "ContextParallel",
    "apply_context_parallel",
    "check_context_parallel",
    "first_token_hook",
    "global_key_mask",
    "head_inputs_hook",
    "keep_chunks",
    "chunk_positions",
    "resolve_exchange",
    "context_seed",
    "gather_sequence",
    "global_order_chunks",
    "packed_document_mask",
    "rank_order_chunks",
]

_CP_SEED_WORD = 0xC0C0  # the derivation's domain word for context-parallel dropout keys

#: model arguments of shape ``[b, s]`` that are cut along the sequence with the tokens
SEQUENCE_ARGS = ("token_types", "padding_mask", "position_ids", "residue_mask", "mask_ratio")


def check_context_parallel(
    dims: Any,
    model: ModelConfig,
    *,
    seq_length: int,
    config: Any = None,
    decoder_seq_length: int | None = None,
) -> None:
    """Refuse a context-parallel layout that does not divide or is not supported.

    ``decoder_seq_length``: a T5 model's decoder length (cut into ``2 * cp`` chunks too).

    Raises:
        ConfigError: naming ``parallel.context_parallel`` (and the other option).
    """
    cp = dims.cp
    lengths = [("data.seq_length", seq_length)]
    if model.type == "t5" and decoder_seq_length is not None:
        lengths.append(("data.seq_length_decoder", decoder_seq_length))
    for option, length in lengths:
        if length % (2 * cp):
            raise ConfigError(
                "parallel.context_parallel",
                f"cuts each sequence into 2 * context_parallel = {2 * cp} chunks: "
                f"{option}={length} must be divisible by {2 * cp}",
            )
    refused = []
    if model.type not in ("gpt", "bert", "esm", "t5"):
        refused.append(f"model.type={model.type!r} (GPT, BERT, ESM-2 and T5 only)")
    if model.type == "t5" and model.position_embedding_type == "relative":
        refused.append(
            "model.position_embedding_type='relative' for T5 (its bias is looked up for "
            "every query and key position pair of a stack, which a rank holding its chunks "
            "does not have; Megatron's T5 with learned_absolute positions is supported)"
        )
    if refused:
        raise ConfigError(
            "parallel.context_parallel",
            f"> 1 is not supported with {', '.join(refused)}; use context_parallel=1 "
            "or change that option",
        )
    exchange = config.context_parallel_exchange if config is not None else "allgather"
    positional = [
        name
        for name, used in (
            ("model.position_embedding_type='alibi'", model.position_embedding_type == "alibi"),
            ("model.sliding_window", getattr(model, "sliding_window", None) is not None),
        )
        if used
    ]
    if positional and resolve_exchange(exchange, model, tp=dims.tp, cp=cp) != "a2a":
        raise ConfigError(
            "parallel.context_parallel_exchange",
            f"{' and '.join(positional)} under context parallelism need the exchange of "
            "heads ('a2a': each head over the whole sequence, its biases and window as one "
            "process computes them); the keys' chunks of 'allgather' and 'p2p' carry no "
            "positions. Use 'a2a' (a tensor-parallel rank's heads must split over "
            "context_parallel) or context_parallel=1",
        )
    if config is None:
        return
    heads, kv = _heads_per_tensor_rank(model, dims.tp)
    if exchange == "p2p" and model.attention_dropout > 0:
        raise ConfigError(
            "parallel.context_parallel_exchange",
            f"'p2p' (the ring) draws no attention dropout: model.attention_dropout="
            f"{model.attention_dropout} must be 0, or use 'a2a' or 'allgather'",
        )
    if exchange == "a2a" and (heads % cp or kv % cp):
        raise ConfigError(
            "parallel.context_parallel_exchange",
            f"'a2a' gives each context-parallel rank heads / context_parallel whole "
            f"heads: a tensor-parallel rank's {heads} query and {kv} key/value heads "
            f"do not split over context_parallel={cp}; use 'allgather'",
        )


def global_key_mask(
    mask: torch.Tensor, group: dist.ProcessGroup, local: int, seq: int, *, causal: bool
) -> torch.Tensor:
    """An attention mask over all ``seq`` keys in global order (bool, True = masked out).

    A key padding mask over this rank's ``local`` keys (``[b, 1, 1, L]``: BERT / ESM-2, T5's
    decoder under the causal mask, T5's encoder output) is gathered over ``group``; a mask
    over all keys (``[b, 1, L or 1, S]``: this rank's
    query rows of a per-document or packed-document mask) is returned as it is.

    Raises:
        ValueError: a mask of another shape.
    """
    shape = tuple(mask.shape)
    if mask.dim() == 4 and shape[-1] == seq and shape[-2] in (1, local):
        return mask
    if mask.dim() == 4 and shape[-1] == local and shape[-2] == 1:
        with torch.no_grad():
            return gather_sequence(mask.contiguous(), group, 3)
    raise ValueError(
        "context parallelism takes an attention_mask [b, 1, 1, L] over this rank's keys "
        f"(bidirectional padding) or [b, 1, L or 1, S] over all keys, got {shape} "
        f"(L={local}, S={seq})"
    )


def _heads_per_tensor_rank(model: ModelConfig, tp: int) -> tuple[int, int]:
    """A tensor-parallel rank's query and key/value heads (one group where they are replicated)."""
    return model.num_attention_heads // tp, max(1, model.num_kv_heads // tp)


def resolve_exchange(exchange: str, model: ModelConfig, *, tp: int, cp: int) -> str:
    """The exchange ``parallel.context_parallel_exchange`` names; ``auto`` resolved.

    ``auto`` (the default) is the memory-light exchange that is exact where it can be:
    ``a2a`` where a tensor-parallel rank's query and key/value heads split over the
    context-parallel ranks (each head the very kernel call one process makes, keys
    and values per rank ``1 / cp``), else ``p2p`` without attention dropout (the
    ring: any head count, ``2 / cp`` of the keys and values), else ``allgather``.
    """
    if exchange != "auto":
        return exchange
    heads, kv = _heads_per_tensor_rank(model, tp)
    if heads % cp == 0 and kv % cp == 0:
        return "a2a"
    return "p2p" if model.attention_dropout == 0 else "allgather"


def chunk_positions(
    seq_length: int, cp: int, cp_rank: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Global positions (int64 ``[2 * seq_length / (2 * cp)]``) held by ``cp_rank``: chunks r and 2cp-1-r."""
    c = seq_length // (2 * cp)
    first = torch.arange(cp_rank * c, (cp_rank + 1) * c, device=device)
    last = torch.arange((2 * cp - 1 - cp_rank) * c, (2 * cp - cp_rank) * c, device=device)
    return torch.cat([first, last])


def packed_document_mask(packed: PackedSequences, local: torch.Tensor) -> torch.Tensor:
    """The document mask of a packed row for the queries at ``local`` positions.

    Args:
        packed: the row's sequences (``T`` tokens).
        local: int64 ``[L]``: the global positions of this rank's tokens
            (:func:`chunk_positions`).

    Returns:
        bool ``[1, 1, L, T]``: True where query ``local[i]`` and key ``t`` belong to
        different sequences (masked out), over all keys in global order.
    """
    docs = packed.document_ids()
    return (docs[local][:, None] != docs[None, :])[None, None]


def context_seed(seed: int, cp_rank: int) -> int:
    """A keyed dropout seed for context-parallel rank ``cp_rank`` (rank 0: ``seed`` itself).

    Under the exact gradient synchronisation dropout is keyed by the micro-batch; the ranks
    of a context-parallel group hold different tokens of the same micro-batch and
    would otherwise draw the same masks for them.
    """
    return seed if cp_rank == 0 else derive_seed(seed, _CP_SEED_WORD, cp_rank) >> 1


def global_order_chunks(pieces: list[torch.Tensor], dim: int) -> list[torch.Tensor]:
    """Every rank's two chunks (rank order) as the ``2 * cp`` chunks of the global sequence."""
    cp = len(pieces)
    halves = [p.chunk(2, dim=dim) for p in pieces]
    return [halves[j][0] if j < cp else halves[2 * cp - 1 - j][1] for j in range(2 * cp)]


def rank_order_chunks(chunks: list[torch.Tensor], dim: int) -> list[torch.Tensor]:
    """The inverse of :func:`global_order_chunks`: each rank's ``[chunk r, chunk 2cp-1-r]``."""
    cp = len(chunks) // 2
    return [torch.cat([chunks[r], chunks[2 * cp - 1 - r]], dim=dim) for r in range(cp)]


class _GatherSequence(torch.autograd.Function):
    """All-gather along ``dim`` (rank order, or ``ordered``: the global chunk order).

    Backward: the gradient of the own slice summed over the group (``reduce``) or taken as is.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, dim: int, reduce: bool, ordered: bool
    ) -> torch.Tensor:
        ctx.group, ctx.dim, ctx.reduce, ctx.ordered = group, dim, reduce, ordered
        ctx.rank, ctx.size = dist.get_rank(group), dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(global_order_chunks(parts, dim) if ordered else parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        size, rank, dim = ctx.size, ctx.rank, ctx.dim
        local = grad.shape[dim] // size
        none = (None, None, None, None)
        if ctx.ordered:  # back to rank order: rank r's slice is [chunk r, chunk 2cp-1-r]
            grad = torch.cat(rank_order_chunks(list(grad.chunk(2 * size, dim=dim)), dim), dim=dim)
        if not ctx.reduce:
            return grad.narrow(dim, rank * local, local).contiguous(), *none
        if dist.get_backend(ctx.group) == "gloo":  # gloo has no reduce-scatter
            grad = grad.contiguous()
            dist.all_reduce(grad, group=ctx.group)
            return grad.narrow(dim, rank * local, local).contiguous(), *none
        stacked = torch.stack(grad.chunk(size, dim=dim)).contiguous()
        out = torch.empty_like(stacked[0])
        dist.reduce_scatter_tensor(out, stacked, group=ctx.group)
        return out, *none


def gather_sequence(
    x: torch.Tensor, group: Any, dim: int = 1, *, reduce_grad: bool = False, ordered: bool = True
) -> torch.Tensor:
    """Every context-parallel rank's chunks of ``x`` along ``dim``, in global order (autograd-aware).

    ``x`` holds this rank's two chunks back to back (:func:`chunk_positions`); the
    result is the whole sequence in order (``ordered=False``: simply rank order).
    ``reduce_grad=True``: the backward sums the gradient of each rank's slice over
    the group (every rank used every slice: keys and values). ``False``: each rank
    keeps its own slice's gradient (every rank computed the same function of the
    gathered values: the replicated loss).
    """
    return _GatherSequence.apply(x, group, dim, reduce_grad, ordered)


class ContextParallel:
    """The context-parallel group of one rank: cutting inputs, attention, gathering outputs.

    Args:
        group: the context-parallel process group (``mesh["cp"]``).
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._masks: dict[tuple[Any, ...], torch.Tensor] = {}
        #: the packed row (``cu_seqlens``) of the micro-batch being computed, whole; None
        #: for a padded batch (:meth:`packed_row`)
        self._row: PackedSequences | None = None

    def packed_row(self) -> PackedSequences | None:
        """The sequences of the packed row the model is computing (the whole row), or None.

        Set by every cut of the inputs (:meth:`forward`, the pipeline hook): a core
        attention that holds whole sequences (the head exchange of canonical units)
        attends within each of them as one process does.
        """
        return self._row

    @staticmethod
    def check_training(*, custom_loss: bool, head: str = "mlm", canonical: bool = False) -> None:
        """Refuse the trainer options context parallelism does not support (naming them).

        Args:
            custom_loss: the trainer has a custom ``loss_fn``.
            head: ``model.head``.
            canonical: the model computes in canonical units.

        Raises:
            ConfigError: a custom ``loss_fn``; a fine-tuning head outside the canonical
                units (each rank would draw the head's dropout on its own rank's key and
                the head's gradients would be summed once per rank).
        """
        if head not in ("mlm", None) and not canonical:
            raise ConfigError(
                "parallel.context_parallel",
                f"> 1 with model.head={head!r} needs the canonical units "
                "(training.layout_invariant=true and parallel.invariant_degree > 1, with a "
                "model and layout they cover: the run says why at start when they do not); "
                "use context_parallel=1 or turn them on",
            )
        if custom_loss:
            raise ConfigError(
                "parallel.context_parallel",
                "> 1 is not supported with a custom loss_fn (it would receive one rank's "
                "chunks of the logits); use a train step whose loss reduces per-token losses",
            )

    # ------------------------------------------------------------------ cutting
    def positions(self, seq_length: int, device: torch.device) -> torch.Tensor:
        """This rank's global positions of a ``seq_length`` sequence (:func:`chunk_positions`)."""
        if seq_length % (2 * self.size):
            raise ConfigError(
                "parallel.context_parallel",
                f"cuts each sequence into {2 * self.size} chunks: the sequence length "
                f"{seq_length} must be divisible by {2 * self.size} (data.seq_length)",
            )
        return chunk_positions(seq_length, self.size, self.rank, device)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's two chunks of ``x`` along ``dim`` (a sequence dimension)."""
        return x.index_select(dim, self.positions(x.shape[dim], x.device))

    def gather(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Every rank's chunks of ``x`` back in global order along ``dim``; backward keeps the own slice."""
        return gather_sequence(x, self.group, dim, reduce_grad=False)

    # ---------------------------------------------------------------- attention
    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        attention_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Local queries against the gathered keys/values, exact (one softmax over all keys).

        Args:
            q: ``[b, heads, L, head_dim]``, this rank's ``L = 2c`` tokens.
            k, v: ``[b, kv_heads, L, head_dim]``; in a cross-attention (``causal`` False)
                this rank's ``Lk`` tokens of the other sequence (T5's encoder output).
            causal: mask keys after each query's global position.
            attention_mask: bool, True = masked out: a key padding mask ``[b, 1, 1, Lk]``
                over this rank's keys (gathered here); causal or
                bidirectional, a mask ``[b, 1, L or 1, S]`` over all keys in global order
                (this rank's query rows of a per-document or packed-document mask, as
                :meth:`forward` cuts it).

        Returns:
            ``[b, heads, L, head_dim]``.

        Raises:
            ValueError: an ``attention_mask`` of another shape.
        """
        local = k.shape[2]  # the queries' too, but in cross-attention (T5)
        seq = local * self.size
        k_all = gather_sequence(k, self.group, 2, reduce_grad=True)
        v_all = gather_sequence(v, self.group, 2, reduce_grad=True)
        rep = q.shape[1] // k_all.shape[1]
        if rep > 1:
            k_all = k_all.repeat_interleave(rep, dim=1)
            v_all = v_all.repeat_interleave(rep, dim=1)
        masked_out = None
        if attention_mask is not None:
            masked_out = global_key_mask(attention_mask, self.group, local, seq, causal=causal)
        if causal:
            return self._causal(q, k_all, v_all, seq, dropout_p, scale, masked_out)
        return F.scaled_dot_product_attention(
            q,
            k_all,
            v_all,
            attn_mask=None if masked_out is None else ~masked_out,
            dropout_p=dropout_p,
            scale=scale,
        )

    def _causal(
        self,
        q: torch.Tensor,
        k_all: torch.Tensor,
        v_all: torch.Tensor,
        seq: int,
        dropout_p: float,
        scale: float | None,
        masked_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of this rank's two chunks, each against the keys up to its end.

        The keys are gathered in global order; chunk ``j`` (``c`` queries) attends to
        keys ``[0, (j + 1) c)`` under a lower-right causal mask (an additive float mask
        ``[c, (j + 1) c]``, built once and shared by every layer of the step). A
        per-document ``masked_out`` (``[b, 1, L or 1, S]``, this rank's query rows)
        is combined with it.
        """
        c = seq // (2 * self.size)
        outs = []
        for half, j in enumerate((self.rank, 2 * self.size - 1 - self.rank)):
            end = (j + 1) * c
            mask = self._lower_right_mask(c, end, q.dtype, q.device)
            if masked_out is not None:
                rows = masked_out if masked_out.shape[-2] == 1 else masked_out[..., half * c :, :]
                mask = mask.masked_fill(rows[..., :c, :end], float("-inf"))
            outs.append(
                F.scaled_dot_product_attention(
                    q[:, :, half * c : (half + 1) * c],
                    k_all[:, :, :end],
                    v_all[:, :, :end],
                    attn_mask=mask,
                    dropout_p=dropout_p,
                    scale=scale,
                )
            )
        return torch.cat(outs, dim=2)

    def _lower_right_mask(
        self, rows: int, cols: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Float ``[rows, cols]``: 0 where key ``t <= cols - rows + i``, ``-inf`` elsewhere (cached)."""
        key = (rows, cols, dtype, device)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) > 8:  # new shapes (sequence length, dtype): drop the old ones
                self._masks.clear()
            future = torch.ones(rows, cols, dtype=torch.bool, device=device).triu(cols - rows + 1)
            mask = torch.zeros(rows, cols, dtype=dtype, device=device)
            mask = mask.masked_fill(future, float("-inf"))
            self._masks[key] = mask
        return mask

    # ------------------------------------------------------------------- model
    def forward(self, module: nn.Module) -> Callable[..., Any]:
        """``module``'s forward on this rank's chunks: ``[b, S]`` inputs in, local ``[b, L, ...]`` out."""
        signature = inspect.signature(module.forward)
        names = list(signature.parameters)

        def run(*args: Any, **kwargs: Any) -> Any:
            values = signature.bind_partial(*args, **kwargs).arguments
            if getattr(module, "is_encoder_decoder", False):
                self._cut_stacks(values)
                return module(**values)
            tokens = values[names[0]]
            seq = tokens.shape[1]
            self._cut(values, names, seq, tokens.device, module, tokens)
            values[names[0]] = self.shard(tokens)
            return module(**values)

        return run

    def install_stage_hook(self, part: nn.Module, *, is_first: bool) -> Any:
        """Cut a pipeline stage's inputs on the way in (pipeline parallelism).

        The pipeline schedule hands every stage the whole micro-batch's keyword
        inputs (``[b, S]``: position ids, per-document masks, padding masks) and the
        first stage its ``[b, S]`` tokens; a stage after the first receives the
        previous stage's hidden states of this rank's chunks (``[b, L, hidden]``,
        ``S = L * cp``). This forward pre-hook cuts the first stage's tokens and every
        stage's keyword inputs like :meth:`forward` does, and gives every stage the
        global positions of this rank's chunks when none are passed (rotary and
        learned positions stay those of the global sequence). Returns the hook's handle.
        """
        names = list(inspect.signature(part.forward).parameters)

        def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> Any:
            values = dict(kwargs)
            x = args[0] if args else values[names[0]]
            seq = x.shape[1] if is_first else x.shape[1] * self.size
            self._cut(values, names, seq, x.device, module, x if is_first else None)
            if is_first:
                x = self.shard(x)
            if args:
                return (x, *args[1:]), values
            values[names[0]] = x
            return args, values

        return part.register_forward_pre_hook(hook, with_kwargs=True)

    def _cut_stacks(self, values: dict[str, Any]) -> None:
        """An encoder-decoder's inputs (T5), cut in place: each stack by its own length.

        ``encoder_tokens`` and ``decoder_tokens`` (``[b, S_enc]``, ``[b, S_dec]``) and their
        padding masks keep this rank's chunks of their own sequence; the stacks' position
        ids become the chunks' global positions (learned positions stay those of one
        process). The decoder's cross-attention reads every rank's chunks of the encoder
        output (:meth:`attention`).
        """
        self._row = None
        for stack in ("encoder", "decoder"):
            tokens = values[f"{stack}_tokens"]
            local = self.positions(tokens.shape[1], tokens.device)
            values[f"{stack}_tokens"] = tokens.index_select(1, local)
            mask = values.get(f"{stack}_padding_mask")
            if isinstance(mask, torch.Tensor):
                values[f"{stack}_padding_mask"] = mask.index_select(1, local.to(mask.device))
            if values.get(f"{stack}_position_ids") is None:
                values[f"{stack}_position_ids"] = local.unsqueeze(0)

    def _cut(
        self,
        values: dict[str, Any],
        names: list[str],
        seq: int,
        device: torch.device,
        module: nn.Module,
        tokens: torch.Tensor | None,
    ) -> None:
        """Cut the keyword inputs in ``values`` (in place) to this rank's chunks of ``seq`` tokens.

        ``cu_seqlens`` (packed sequences, THD) becomes per-document positions and a
        document mask (:func:`packed_document_mask`); a per-document ``attention_mask``
        ``[b, 1, S, S]`` keeps this rank's query rows (over all ``S`` keys, global order);
        ``[b, S]`` inputs (:data:`SEQUENCE_ARGS`) are cut; missing position ids become
        this rank's global positions. ESM's token dropout: its ratios of masked tokens
        are counted on the whole sequences (``tokens``, ``[b, S]``, the model's
        ``mask_ratio_of``) and cut like the tokens.

        Raises:
            ConfigError: a KV cache, or ``seq`` not divisible by ``2 * cp``.
            ValueError: packed sequences given to a model without ``attention_mask``,
                or a sequence longer than the model's ``max_position_embeddings``.
        """
        if values.get("kv_cache") is not None:
            raise ConfigError(
                "parallel.context_parallel",
                "> 1 is not supported with a KV cache (generation); use context_parallel=1",
            )
        local = self.positions(seq, device)
        config = getattr(module, "config", None)
        cu_seqlens = values.get("cu_seqlens")
        packed = None
        if cu_seqlens is not None:
            packed = PackedSequences.from_cu_seqlens(cu_seqlens.to(device), total=seq)
        self._row = packed
        if (
            tokens is not None
            and getattr(config, "token_dropout", False)
            and "mask_ratio" in names
            and values.get("mask_ratio") is None
        ):
            values["mask_ratio"] = module.mask_ratio_of(tokens, values.get("padding_mask"), packed)
        if packed is not None:
            if "attention_mask" not in names:
                raise ValueError(
                    "context parallelism over packed sequences (cu_seqlens) needs a model "
                    "whose forward takes attention_mask"
                )
            limit = getattr(config, "max_position_embeddings", None)
            if limit is not None and packed.max_seqlen > limit:
                raise ValueError(
                    f"sequence length {packed.max_seqlen} exceeds max_position_embeddings={limit}"
                )
            values["cu_seqlens"] = None
            values["attention_mask"] = packed_document_mask(packed, local)
            if values.get("position_ids") is None:
                values["position_ids"] = packed.position_ids()
        else:
            mask = values.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[-2] == seq:
                values["attention_mask"] = mask.index_select(2, local.to(mask.device))
        if "position_ids" in names and values.get("position_ids") is None:
            values["position_ids"] = torch.arange(seq, device=device).unsqueeze(0)
        for name in SEQUENCE_ARGS:
            t = values.get(name)
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[1] == seq:
                values[name] = t.index_select(1, local.to(t.device))

    @torch.no_grad()
    def sum_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the context-parallel group (no gradient; MoE balance statistics)."""
        x = x.detach().clone()
        dist.all_reduce(x, group=self.group)
        return x

    @torch.no_grad()
    def reduce_grads(self, parameters: list[torch.Tensor]) -> None:
        """Sum the gradients over the context-parallel group (one all-reduce of a flat buffer)."""
        grads = []
        for p in parameters:
            g = p.grad
            if g is None:
                continue
            grads.append(g.to_local() if isinstance(g, DTensor) else g)
        if not grads:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for group in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in group])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for g in group:
                n = g.numel()
                g.copy_(flat[offset : offset + n].view_as(g))
                offset += n


class _KeepChunks(torch.autograd.Function):
    """This rank's chunks of a whole sequence; the backward gathers every rank's gradient."""

    @staticmethod
    def forward(ctx: Any, whole: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        local = chunk_positions(whole.shape[1], size, rank, whole.device)
        return whole.index_select(1, local)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return gather_sequence(grad.contiguous(), ctx.group, 1), None


def keep_chunks(whole: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's chunks ``[b, L, ...]`` of ``whole`` ``[b, S, ...]``, which every rank computed.

    The backward gathers the chunks' gradients in global order, so that the computation
    before it gets the whole gradient on every rank, as one process does.
    """
    return _KeepChunks.apply(whole, group)


def first_token_hook(group: Any) -> Callable[..., tuple[Any, ...]]:
    """A pooler's forward pre-hook: ``[b, L, hidden]`` -> the sequence's first token ``[b, 1, hidden]``.

    Context-parallel rank 0 holds it (chunk 0 first): every rank gathers each rank's
    first token and keeps rank 0's, so every rank pools the same token; the gather's
    backward gives only rank 0 (its own token) the trunk's gradient.
    """

    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        firsts = gather_sequence(args[0][:, :1].contiguous(), group, 1, ordered=False)
        return (firsts[:, :1], *args[1:])

    return hook


def head_inputs_hook(group: Any) -> Callable[..., tuple[Any, ...]]:
    """A fine-tuning head's forward pre-hook: its hidden states and residue mask gathered.

    ``(hidden [b, L, h], residue_mask [b, L], ...)`` -> the whole sequence's, in global
    order; every rank then computes the head as one process does (its output whole,
    ``[b, num_labels]`` or ``[b, S, num_labels]``), and the gather's backward keeps each
    rank's own slice of the trunk's gradient. Canonical units only: the head's
    parameters get their whole gradient on every rank.
    """

    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = gather_sequence(args[0], group, 1)
        rest = list(args[1:])
        if rest and isinstance(rest[0], torch.Tensor):
            with torch.no_grad():
                rest[0] = gather_sequence(rest[0].contiguous(), group, 1)
        return (hidden, *rest)

    return hook


class _GradientOnRankZero(torch.autograd.Function):
    """Identity forward; backward keeps the gradient on rank 0 of the group, zero elsewhere."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: bool) -> torch.Tensor:
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (grad if ctx.keep else torch.zeros_like(grad)), None


def apply_context_parallel(
    part: nn.Module,
    cp: ContextParallel,
    core: Callable[[nn.Module], Any] | None = None,
    cross_core: Callable[[nn.Module], Any] | None = None,
) -> int:
    """Point every attention's seam at the exchange; return how many were replaced.

    ``core(attention)`` builds a self-attention module's seam (``parallel.context_parallel_exchange``
    ``a2a``: :class:`~epochal.parallel.canonical_context.HeadExchangeAttention`, whole heads
    over the whole sequence); None points every seam at ``cp.attention`` (``allgather``:
    every rank's keys and values gathered). ``cross_core(attention)`` likewise for the
    cross-attentions of an encoder-decoder (None: ``cp.attention``, the context's keys and
    values gathered; the ring has no cross-attention form).

    A BERT binary head pools the first token from the rank that holds it
    (:func:`first_token_hook`); every rank computes the same binary logits, and only
    rank 0 back-propagates them (the gradients are summed over the group afterwards).
    """
    from epochal.model.layers.attention import Attention  # local: model is a leaf
    from epochal.model.layers.moe import MoEMLP  # local: model is a leaf

    count = 0
    for module in part.modules():
        if isinstance(module, Attention) and module.mask_kind != "cross":
            module.core_attention = cp.attention if core is None else core(module)
            count += 1
        elif isinstance(module, Attention):
            module.core_attention = cp.attention if cross_core is None else cross_core(module)
            count += 1
        if isinstance(module, MoEMLP):  # balance statistics over the whole sequence
            module.token_sum = cp.sum_tokens
    if part._modules.get("pooler") is not None:
        part.pooler.register_forward_pre_hook(first_token_hook(cp.group))
    if part._modules.get("binary_head") is not None:
        keep = cp.rank == 0
        part.binary_head.register_forward_hook(
            lambda module, args, out: _GradientOnRankZero.apply(out, keep)
        )
    return count
