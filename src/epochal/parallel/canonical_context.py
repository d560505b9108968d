"""Exact context parallelism: attention by an all-to-all of heads (Ulysses), each head on the whole sequence.

Under context parallelism a rank holds the tokens of the sequence chunks ``r``
and ``2 cp - 1 - r`` (:mod:`epochal.parallel.context_parallel`). Every reduction
over tokens outside attention is a folded token sum in canonical units
(:mod:`epochal.parallel.canonical`); attention reduces over the keys, and for one
query to get one process's bits its softmax and its product with the values must
run over the same keys by the same kernel call. An all-gather of keys and values
(the plain path) gives each rank the keys but computes only its own queries: the
kernel's blocking over queries, the causal block skipping and the key length of
each call then differ from one process. Exchanging heads instead (DeepSpeed-
Ulysses, Megatron-Core's ``--cp-comm-type a2a``) gives each rank ``heads / cp``
whole heads over the whole sequence, so each head is computed by the very call
one process makes for it (the kernel's result for a head does not depend on how
many heads a call holds, as under tensor parallelism), and its memory falls as
``1 / cp`` too: no rank holds another rank's keys of other heads.

The exchange: queries, keys and values ``[b, heads, L, hd]`` (this rank's ``L =
S / cp`` tokens) go out as ``cp`` head groups (``all_to_all_single``); what comes
back is this rank's head group for every rank's tokens, put in global order
(``[b, heads / cp, S, hd]``); the attention's output goes back the same way.
Its backward is the same exchange in reverse. A per-document mask over this
rank's query rows (``[b, 1, L, S]``) is gathered to all rows, a key padding mask
over this rank's keys (``[b, 1, 1, L]``, BERT / ESM-2) to all keys. A packed row
(``data.pack_sequences``) attends within each of its sequences, by the call one
process makes for it (:meth:`~epochal.model.layers.attention.Attention.bidirectional_core`
with the row's sequences, :meth:`~epochal.parallel.context_parallel.ContextParallel.packed_row`).

ALiBi and sliding windows (causal): each head group runs through the module's own causal
core over the whole sequence, its ALiBi slopes those of the group's heads, so the
biases and windows are one process's (not with a replaced ``inner`` core).

Needs the query heads and the key/value heads of a tensor-parallel rank to split
over the context-parallel group (:func:`~epochal.parallel.canonical_plan.canonical_refusal`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from epochal.model.layers.packing import PackedSequences
from epochal.parallel.context_parallel import (
    gather_sequence,
    global_order_chunks,
    rank_order_chunks,
)

__all__ = ["HeadExchangeAttention"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of ``[cp, ...]`` (piece ``g`` to rank ``g``); the backward is the same exchange."""

    @staticmethod
    def forward(ctx: Any, stacked: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(stacked, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, stacked.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def _to_heads(t: torch.Tensor, group: dist.ProcessGroup, cp: int) -> torch.Tensor:
    """``[b, h, L, hd]`` this rank's tokens -> ``[b, h / cp, S, hd]`` its head group, global order."""
    b, h, length, hd = t.shape
    stacked = t.reshape(b, cp, h // cp, length, hd).transpose(0, 1)
    received = _AllToAll.apply(stacked, group)  # [cp (source rank), b, h / cp, L, hd]
    return torch.cat(global_order_chunks(list(received.unbind(0)), 2), dim=2)


def _to_sequence(t: torch.Tensor, group: dist.ProcessGroup, cp: int) -> torch.Tensor:
    """The inverse of :func:`_to_heads`: ``[b, h / cp, S, hd]`` -> ``[b, h, L, hd]``."""
    # [cp (destination rank), b, h / cp, L, hd]
    stacked = torch.stack(rank_order_chunks(list(t.chunk(2 * cp, dim=2)), 2))
    received = _AllToAll.apply(stacked, group)  # [cp (source head group), ...]
    b, length, hd = received.shape[1], received.shape[3], received.shape[4]
    return received.transpose(0, 1).reshape(b, -1, length, hd)


class HeadExchangeAttention:
    """The attention seam (``core_attention``) under exact context parallelism (module docstring).

    Args:
        group: the context-parallel process group.
        module: the attention module whose own causal computation
            (:meth:`~epochal.model.layers.attention.Attention.causal_core`) runs this
            rank's head group over the whole sequence when ``inner`` is None.
        inner: a replaced core to run instead (keyed dropout per global head).
        packed_row: returns the sequences of the packed row being computed (whole), or
            None for a padded batch (bidirectional attention only).
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        module: Any,
        inner: Callable[..., torch.Tensor] | None = None,
        packed_row: Callable[[], PackedSequences | None] | None = None,
    ) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.module = module
        self.inner = inner
        self.packed_row = packed_row

    @property
    def takes_positions(self) -> bool:
        """Whether ALiBi and sliding windows apply: the module's own core runs each head
        group over the whole sequence (not a replaced ``inner`` core)."""
        return self.inner is None

    def __deepcopy__(self, memo: dict[int, object]) -> HeadExchangeAttention:
        """The copy attends with the copied module (the group and the row's source are shared)."""
        return HeadExchangeAttention(
            self.group,
            copy.deepcopy(self.module, memo),
            copy.deepcopy(self.inner, memo),
            self.packed_row,
        )

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
    ) -> torch.Tensor:
        cp = self.size
        if q.shape[1] % cp or k.shape[1] % cp:
            raise ValueError(
                f"{q.shape[1]} query and {k.shape[1]} key/value heads do not split over "
                f"context_parallel={cp} (the head exchange)"
            )
        local, key_local = q.shape[2], k.shape[2]  # they differ in cross-attention
        seq, key_seq = local * cp, key_local * cp
        q, k, v = (_to_heads(t, self.group, cp) for t in (q, k, v))
        packed = None if causal or self.packed_row is None else self.packed_row()
        if packed is not None:  # within each sequence of the row: no mask
            if self.inner is not None:
                raise ValueError("packed sequences do not go through a replaced core attention")
            out = self.module.bidirectional_core(q, k, v, packed=packed)
            return _to_sequence(out, self.group, cp)
        if attention_mask is not None:
            with torch.no_grad():  # global order: every query row, every key
                if attention_mask.shape[-2] not in (1, seq):
                    attention_mask = gather_sequence(attention_mask.contiguous(), self.group, 2)
                if attention_mask.shape[-1] == key_local and key_local != key_seq:
                    attention_mask = gather_sequence(attention_mask.contiguous(), self.group, 3)
        if self.inner is not None:
            out = self.inner(
                q,
                k,
                v,
                causal=causal,
                attention_mask=attention_mask,
                dropout_p=dropout_p,
                scale=scale,
            )
        elif causal:  # this rank's head group: its ALiBi slopes
            group = q.shape[1]
            heads = slice(self.rank * group, (self.rank + 1) * group)
            out = self.module.causal_core(q, k, v, attention_mask, heads=heads)
        else:
            out = self.module.bidirectional_core(q, k, v, attention_mask)
        return _to_sequence(out, self.group, cp)
