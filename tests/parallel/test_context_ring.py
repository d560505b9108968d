"""Ring attention (``context_parallel_exchange = "p2p"``) against one process's attention.

Every rank draws the whole sequence's queries, keys, values and output gradient, runs
the ring on its two chunks and compares its outputs and gradients with the slices of
``scaled_dot_product_attention`` over the whole sequence: causal, grouped keys/values,
a per-document mask over all keys, and bidirectional attention with a key padding mask,
on two and four ranks. The training runs are in :mod:`tests.parallel.test_context_parallel`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.dist_utils import run_gloo

B, H, S, D = 2, 4, 48, 8


def _case(name: str, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    kv_heads = 2 if name == "gqa" else H
    q = torch.randn(B, H, S, D, generator=g)
    k = torch.randn(B, kv_heads, S, D, generator=g)
    v = torch.randn(B, kv_heads, S, D, generator=g)
    out_grad = torch.randn(B, H, S, D, generator=g)
    masked_out = None  # True = masked out, [b, 1, S or 1, S]
    if name == "documents":
        docs = (torch.rand(B, S, generator=g) < 0.2).long().cumsum(1)
        masked_out = docs[:, None, :, None] != docs[:, None, None, :]
    if name == "padding":
        lengths = torch.tensor([S, S - 13])
        masked_out = (torch.arange(S)[None, :] >= lengths[:, None])[:, None, None, :]
    causal = name not in ("padding", "bidirectional")
    return dict(q=q, k=k, v=v, out_grad=out_grad, masked_out=masked_out, causal=causal)


def _reference(case: dict) -> tuple[torch.Tensor, ...]:
    q, k, v = (case[n].clone().requires_grad_() for n in ("q", "k", "v"))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    allowed = None
    if case["causal"]:
        allowed = torch.ones(S, S, dtype=torch.bool).tril()[None, None]
    if case["masked_out"] is not None:
        keep = ~case["masked_out"]
        allowed = keep if allowed is None else allowed & keep
    out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed)
    out.backward(case["out_grad"])
    return out.detach(), q.grad, k.grad, v.grad


def _ring_checks(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    from epochal.parallel import context_ring
    from epochal.parallel.context_parallel import chunk_positions
    from epochal.parallel.context_ring import RingAttention

    torch.set_num_threads(1)
    pos = chunk_positions(S, world_size, rank)
    ring = RingAttention(dist.group.WORLD)
    out = {}
    whole, fused = context_ring._BLOCK_ELEMENTS, context_ring._FUSED_BACKWARD
    for name in ("causal", "gqa", "bidirectional", "documents", "padding", "blocks"):
        # without a mask the fused kernel's blocks; "blocks": the causal case by the
        # float32 path (that of the masks), five query rows at a time
        context_ring._BLOCK_ELEMENTS = 5 * B * H * (S // world_size) if name == "blocks" else whole
        context_ring._FUSED_BACKWARD = None if name == "blocks" else fused
        case = _case("causal" if name == "blocks" else name)
        want = [t[:, :, pos] for t in _reference(case)]
        q, k, v = (case[n][:, :, pos].clone().requires_grad_() for n in ("q", "k", "v"))
        mask = case["masked_out"]
        if mask is not None:  # this rank's query rows over all keys; padding: its own keys
            mask = mask[..., pos] if name == "padding" else mask[:, :, pos]
        got = ring(q, k, v, causal=case["causal"], attention_mask=mask, dropout_p=0.0, scale=None)
        got.backward(case["out_grad"][:, :, pos])
        out[name] = [
            float((g - w).abs().max()) for g, w in zip((got, q.grad, k.grad, v.grad), want)
        ]
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_ring_computes_one_processs_attention_and_gradients(world_size):
    for per_rank in run_gloo(_ring_checks, world_size):
        for name, errors in per_rank.items():
            assert max(errors) < 1e-5, (name, errors)  # output, dq, dk, dv


def test_the_ring_refuses_attention_dropout():
    from epochal.parallel.context_ring import RingAttention

    ring = RingAttention.__new__(RingAttention)  # no group needed to refuse
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="p2p.*attention dropout"):
        ring(q, q, q, causal=True, attention_mask=None, dropout_p=0.1, scale=None)
