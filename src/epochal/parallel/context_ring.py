"""Ring attention under context parallelism: keys and values passed around the group.

``parallel.context_parallel_exchange = "p2p"`` (Megatron-Core's ``--cp-comm-type p2p``,
torchtitan's ring). Each rank keeps its own queries ``[b, h, L, d]`` (its ``L = S / cp``
tokens: sequence chunks ``r`` and ``2 cp - 1 - r``) and one key/value block at a time:
at step ``t`` it holds rank ``(r - t) mod cp``'s keys and values, computes its queries
against them, and passes the block to rank ``r + 1`` while it computes (the next block
arrives from ``r - 1``). The partial results merge by their log-sum-exp::

    lse = logaddexp(lse, lse_t)
    out = out * exp(lse_old - lse) + out_t * exp(lse_t - lse)

so the result is the softmax over all keys without any rank holding them all: a
layer's keys and values per rank are ``2 / cp`` of the sequence's (its own and the
block in flight), where the all-gather holds all of them.

The backward pass goes around the ring again: each block's keys and values travel with
their gradients' accumulators; a rank recomputes its queries' probabilities against the
block from the saved log-sum-exp (no ``[L, S]`` matrix is kept), adds its share to the
block's key and value gradients and its own query gradient, and passes the block on;
after ``cp`` steps every block's gradients are back with its owner. Keys and values
are sent ahead while the block computes; the gradients follow when it is done.

Without a mask beyond causality, on the CPU, each block is one call of PyTorch's fused
CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``, which returns
the block's log-sum-exp; its backward takes the merged output and log-sum-exp), on the
blocks Megatron's load-balanced chunks leave: at step 0 the rank's own keys, causal
within them (the two chunks are in increasing global order); from a rank ``j < r`` its
first chunk, seen whole by every query; from ``j > r`` both chunks, seen whole by the
rank's second chunk only; bidirectional, every block whole. Key/value heads are repeated
to the query heads per block, and their gradients summed back.

Otherwise (a key padding or document mask, or another device) the scores are computed
in float32 in query blocks of bounded size (about
``_BLOCK_ELEMENTS`` scores at a time), so no ``[L, L]`` matrix of a whole head is ever
alive either. Masks: causal by global position (each chunk's queries see the keys at or
before their positions), a key padding mask over this rank's keys (``[b, 1, 1, L]``,
gathered once), or a mask over all keys in global order (``[b, 1, L or 1, S]``: this
rank's query rows of a per-document or packed-sequence mask). Grouped keys and values
(fewer key/value heads than query heads) are not repeated: each key/value head's
queries are computed together.

The result equals one process's attention within float rounding (another order of
the same sums), as the all-gather's does; attention dropout is refused
(:func:`~epochal.parallel.context_parallel.check_context_parallel`): the block's mask
would have to be drawn again in the backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from epochal.parallel.context_parallel import chunk_positions, global_key_mask

__all__ = ["RingAttention"]

#: scores computed at once per query block (float32 elements: 4 MiB)
_BLOCK_ELEMENTS = 1 << 20


def _start_ring(
    send: torch.Tensor, recv: torch.Tensor, group: dist.ProcessGroup
) -> list[dist.Work]:
    """Send ``send`` to the next rank of ``group``, receive ``recv`` from the previous one."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    ops = [
        dist.P2POp(dist.isend, send, dist.get_global_rank(group, (rank + 1) % size), group),
        dist.P2POp(dist.irecv, recv, dist.get_global_rank(group, (rank - 1) % size), group),
    ]
    return dist.batch_isend_irecv(ops)


def _send_on(
    kv: torch.Tensor, t: int, cp: int, group: dist.ProcessGroup
) -> tuple[torch.Tensor | None, list[dist.Work]]:
    """At ring step ``t``: the next block's buffer and the started exchange (none at the last step)."""
    if t == cp - 1:
        return None, []
    incoming = torch.empty_like(kv)
    return incoming, _start_ring(kv, incoming, group)


def _pass_on(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``x`` sent to the next rank; the previous rank's, received (waited for)."""
    back = torch.empty_like(x)
    _wait(_start_ring(x, back, group))
    return back


def _wait(works: list[dist.Work]) -> None:
    for work in works:
        work.wait()


class _Blocks:
    """The masks of this rank's queries against rank ``j``'s keys, per query block.

    Args:
        q_pos: int64 ``[L]``: this rank's queries' global positions.
        seq: the whole sequence's length ``S``.
        cp: the group's size.
        causal: keys after a query's position are masked.
        masked_out: bool ``[b, 1, L or 1, S]`` (True = masked out) over all keys, or None.
        rows: queries per block.
    """

    def __init__(
        self,
        q_pos: torch.Tensor,
        seq: int,
        cp: int,
        causal: bool,
        masked_out: torch.Tensor | None,
        rows: int,
    ) -> None:
        self.q_pos, self.seq, self.cp = q_pos, seq, cp
        self.causal, self.masked_out, self.rows = causal, masked_out, rows

    def spans(self) -> list[tuple[int, int]]:
        length = self.q_pos.numel()
        return [(a, min(a + self.rows, length)) for a in range(0, length, self.rows)]

    def allowed(self, j: int, a: int, b: int) -> torch.Tensor | None:
        """bool ``[b or 1, 1, 1, rows, L]``: where queries ``a:b`` may see rank ``j``'s keys (None: all)."""
        k_pos = chunk_positions(self.seq, self.cp, j, self.q_pos.device)
        out = None
        if self.causal:
            out = (k_pos[None, :] <= self.q_pos[a:b, None])[None, None, None]
        if self.masked_out is not None:
            rows = (
                self.masked_out if self.masked_out.shape[-2] == 1 else self.masked_out[..., a:b, :]
            )
            keep = ~rows[..., k_pos].unsqueeze(2)  # [b, 1, 1, rows or 1, L]
            out = keep if out is None else out & keep
        return out


def _scores(
    q: torch.Tensor, k: torch.Tensor, scale: float, allowed: torch.Tensor | None
) -> torch.Tensor:
    """float32 ``[b, g, r, rows, L]`` scores, ``-inf`` where masked."""
    s = torch.einsum("bgrqd,bgkd->bgrqk", q.float(), k.float()) * scale
    return s if allowed is None else s.masked_fill(~allowed, float("-inf"))


def _probabilities(s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """``exp(s - lse)``, 0 on rows whose keys are all masked (``lse = -inf``)."""
    finite = torch.isfinite(lse)
    return torch.exp(s - torch.where(finite, lse, 0.0).unsqueeze(-1)) * finite.unsqueeze(-1)


def _merge(
    out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """``out``, ``lse`` (in place) become the softmax over their keys and ``part``'s."""
    new = torch.logaddexp(lse, part_lse)
    finite = torch.isfinite(new)
    safe = torch.where(finite, new, 0.0)
    old_w = torch.where(finite, torch.exp(lse - safe), 0.0).unsqueeze(-1)
    new_w = torch.where(finite, torch.exp(part_lse - safe), 0.0).unsqueeze(-1)
    out.mul_(old_w).addcmul_(part, new_w)  # no [b, h, rows, d] temporary
    lse.copy_(new)


class _Ring(torch.autograd.Function):
    """The ring's forward and backward (module docstring); ``q`` is ``[b, g, r, L, d]``."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        blocks: _Blocks,
        scale: float,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for t in range(cp):
            j = (rank - t) % cp
            incoming, works = _send_on(kv, t, cp, group)
            for a, b in blocks.spans():
                s = _scores(q[..., a:b, :], kv[0], scale, blocks.allowed(j, a, b))
                part_lse = torch.logsumexp(s, dim=-1)
                part = torch.einsum("bgrqk,bgkd->bgrqd", _probabilities(s, part_lse), kv[1].float())
                _merge(out[..., a:b, :], lse[..., a:b], part, part_lse)
            _wait(works)
            if incoming is not None:
                kv = incoming
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks, ctx.scale, ctx.group = blocks, scale, group
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        blocks: _Blocks = ctx.blocks
        scale, group = ctx.scale, ctx.group
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        grad = grad.float()
        delta = (grad * out).sum(-1)  # [b, g, r, L]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        for t in range(cp):
            j = (rank - t) % cp
            incoming, works = _send_on(kv, t, cp, group)
            kf, vf = kv[0].float(), kv[1].float()
            for a, b in blocks.spans():
                qa, ga = q[..., a:b, :].float(), grad[..., a:b, :]
                p = _probabilities(
                    _scores(qa, kv[0], scale, blocks.allowed(j, a, b)), lse[..., a:b]
                )
                dkv[1] += torch.einsum("bgrqk,bgrqd->bgkd", p, ga)
                dp = torch.einsum("bgrqd,bgkd->bgrqk", ga, vf)
                ds = p * (dp - delta[..., a:b].unsqueeze(-1))
                dq[..., a:b, :] += torch.einsum("bgrqk,bgkd->bgrqd", ds, kf) * scale
                dkv[0] += torch.einsum("bgrqk,bgrqd->bgkd", ds, qa) * scale
            _wait(works)
            dkv = _pass_on(dkv, group)  # the block's gradients follow it
            if incoming is not None:
                kv = incoming
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FUSED_BACKWARD = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None
)


def _fused_block(t: int, j: int, rank: int, half: int, causal: bool) -> tuple[slice, slice, bool]:
    """(this rank's queries, the block's keys, causal within the block) at ring step ``t``."""
    whole = slice(None)
    if t == 0 or not causal:
        return whole, whole, causal and t == 0
    if j < rank:  # its first chunk precedes both of ours; its second follows both
        return whole, slice(0, half), False
    return slice(half, None), whole, False  # only our second chunk follows its two


def _block_heads(kv: torch.Tensor, keys: slice, rep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's keys and values ``[b, h, keys, d]`` for the kernel: heads repeated ``rep``
    times (grouped keys/values), a copy only where a repeat or a partial block needs one."""
    if rep == 1:
        return kv[0][:, :, keys].contiguous(), kv[1][:, :, keys].contiguous()
    return tuple(x[:, :, keys].repeat_interleave(rep, dim=1) for x in kv)  # type: ignore[return-value]


class _FusedRing(torch.autograd.Function):
    """The ring with one fused CPU kernel call per block (module docstring); ``q`` ``[b, h, L, d]``."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        rep, half = q.shape[1] // k.shape[1], q.shape[2] // 2
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        own = kv = torch.stack([k, v]).contiguous()  # kept for the backward: no second copy
        for t in range(cp):
            j = (rank - t) % cp
            incoming, works = _send_on(kv, t, cp, group)
            rows, keys, block_causal = _fused_block(t, j, rank, half, causal)
            kr, vr = _block_heads(kv, keys, rep)
            part, part_lse = _FUSED(
                q[:, :, rows].contiguous(), kr, vr, 0.0, block_causal, scale=scale
            )
            _merge(out[:, :, rows], lse[:, :, rows], part.float(), part_lse.float())
            _wait(works)
            if incoming is not None:
                kv = incoming
        result = out.to(q.dtype)
        ctx.save_for_backward(q, own, result, lse)
        ctx.causal, ctx.scale, ctx.group = causal, scale, group
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, kv, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        _, b, g, length, d = kv.shape
        rep, half = q.shape[1] // g, q.shape[2] // 2
        grad = grad.to(q.dtype).contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dtype = kv.dtype
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        for t in range(cp):
            j = (rank - t) % cp
            incoming, works = _send_on(kv, t, cp, group)
            rows, keys, block_causal = _fused_block(t, j, rank, half, ctx.causal)
            kr, vr = _block_heads(kv, keys, rep)
            dq_b, dk_b, dv_b = _FUSED_BACKWARD(
                grad[:, :, rows].contiguous(),
                q[:, :, rows].contiguous(),
                kr,
                vr,
                out[:, :, rows].contiguous(),
                lse[:, :, rows].contiguous(),
                0.0,
                block_causal,
                scale=scale,
            )
            dq[:, :, rows] += dq_b.float()
            for i, dx in enumerate((dk_b, dv_b)):  # the repeated heads' gradients added back
                dx = dx.float() if rep == 1 else dx.float().view(b, g, rep, -1, d).sum(2)
                dkv[i][:, :, keys] += dx
            _wait(works)
            dkv = _pass_on(dkv, group)  # the block's gradients follow it
            if incoming is not None:
                kv = incoming
        return dq.to(q.dtype), dkv[0].to(dtype), dkv[1].to(dtype), None, None, None


class RingAttention:
    """The attention seam (``core_attention``) under ``context_parallel_exchange = "p2p"``.

    Args:
        group: the context-parallel process group.
    """

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def __deepcopy__(self, memo: dict[int, object]) -> RingAttention:
        """The same group (a handle, not state)."""
        return self

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
        """``[b, h, L, d]`` queries, ``[b, g, L, d]`` keys and values (this rank's tokens) -> ``[b, h, L, d]``.

        Raises:
            ValueError: attention dropout (``dropout_p > 0``), query heads that are no
                multiple of the key/value heads, or a mask of another shape.
        """
        if dropout_p > 0:
            raise ValueError(
                "parallel.context_parallel_exchange='p2p' does not draw attention dropout "
                "(model.attention_dropout must be 0); use 'a2a' or 'allgather'"
            )
        b, h, length, d = q.shape
        g = k.shape[1]
        if h % g:
            raise ValueError(f"{h} query heads are no multiple of {g} key/value heads")
        seq = length * self.size
        masked_out = None
        if attention_mask is not None:
            masked_out = global_key_mask(attention_mask, self.group, length, seq, causal=causal)
        scale = scale or d**-0.5
        if masked_out is None and q.device.type == "cpu" and _FUSED_BACKWARD is not None:
            return _FusedRing.apply(q, k.contiguous(), v.contiguous(), causal, scale, self.group)
        rows = max(1, _BLOCK_ELEMENTS // max(1, h * length * b))
        q_pos = chunk_positions(seq, self.size, self.rank, q.device)
        blocks = _Blocks(q_pos, seq, self.size, causal, masked_out, rows)
        grouped = q.view(b, g, h // g, length, d)
        out = _Ring.apply(grouped, k.contiguous(), v.contiguous(), blocks, scale, self.group)
        return out.view(b, h, length, d)
