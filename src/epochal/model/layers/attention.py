"""Attention: multi-head, multi-query and grouped-query, on SDPA, with a mask kind.

Mask kinds (:data:`MASK_KINDS`, fixed per module at construction):

- ``"causal"``: self-attention where query ``i`` sees keys ``j <= i`` (GPT; the
  default for ``ModelConfig.type == "gpt"``), optionally with a KV cache.
- ``"bidirectional"``: self-attention where every query sees every key (BERT,
  ESM; the default for encoder types). Padding is masked with an
  ``attention_mask`` built by :func:`padding_attention_mask` from a ``[b, s]``
  padding mask (1 = real token, 0 = padding, Megatron's ``padding_mask``).
- ``"cross"``: queries from ``x``, keys and values from another sequence
  (``context``, e.g. an encoder's output for an encoder-decoder model); every
  query sees every context token not masked out. No positions are applied.

Parameters (names are stable; the tensor-parallel plan and the checkpoint
converters rely on them):

- ``wq``: ``nn.Linear(hidden, num_attention_heads * head_dim, bias=qkv_bias)``
- ``wk``, ``wv``: ``nn.Linear(hidden, num_query_groups * head_dim, bias=qkv_bias)``
- ``wo``: ``nn.Linear(num_attention_heads * head_dim, hidden, bias=add_bias_linear)``
- ``q_layernorm``, ``k_layernorm`` (``qk_layernorm`` only): the config's norm over
  ``head_dim`` channels, applied to every query / key head before the rotary
  embedding (Qwen3's ``q_norm`` / ``k_norm``; Megatron-Core's names)
- buffer ``alibi_slopes`` (ALiBi only, non-persistent): ``[heads computed here]``

Sliding window (causal only, ``config.sliding_window = w``): query ``i`` (its
position among the keys) sees keys ``i - w < j <= i``, as Hugging Face Mistral /
Qwen2 do; with a KV cache the window is measured over the cached positions too
(cached keys are kept, only masked). A sequence of at most ``w`` keys needs no
window mask and runs the plain causal kernel.

Tensor-parallel friendliness: head counts are derived in ``forward`` from the
projected tensors' shapes (``view(b, s, -1, head_dim)``), and the GQA repeat
factor is ``local q heads // local kv heads``, so column-sharded q/k/v and
row-sharded ``wo`` work unchanged. Query head ``i`` uses key/value group
``i // (q heads / kv heads)`` (Megatron's and Hugging Face's grouping). For ALiBi
under tensor parallelism set :attr:`Attention.alibi_heads` to this rank's
slice of heads and call :meth:`Attention.init_buffers`.

Query-key scale: ``config.softmax_scale`` (``None`` = ``1 / sqrt(head_dim)``;
Hugging Face T5 uses 1.0).

Additive position bias (T5's relative attention bias): ``forward(...,
position_bias=bias)`` with a float ``[1 or b, heads, s, s_k]`` tensor adds it to
the scaled scores, after which the mask kind's masks (causal, ``attention_mask``)
apply as ``-inf``. Under tensor parallelism the bias holds every head and
:attr:`Attention.bias_heads` selects this module's slice (like ``alibi_heads``).

Packed sequences (bidirectional only): ``forward(..., packed=p)`` with a
:class:`~epochal.model.layers.packing.PackedSequences` takes ``x`` as one row
``[1, T, hidden]`` of sequences packed back to back and confines attention to
each sequence (:func:`~epochal.model.layers.packing.packed_attention`); ``rope``
then holds each token's position within its own sequence.

Core attention seam: :attr:`Attention.core_attention` (None by default) replaces the
softmax(QK^T)V of causal and bidirectional self-attention, and of cross-attention
without a cache, when set from outside (``epochal.parallel`` installs context
parallelism and per-head dropout there): it is called as
``core_attention(q, k, v, causal=..., attention_mask=..., dropout_p=..., scale=...)``
with queries ``[b, heads, s, head_dim]`` and keys/values ``[b, kv_heads, s_k, head_dim]``
(rotated, before any GQA repeat; ``s_k`` the context's length for cross-attention)
and returns ``[b, heads, s, head_dim]``. Its owner
refuses the features it does not handle (caches, biases, windows, packing); the
model raises if one of them reaches a replaced seam.

Incremental decoding: ``forward(..., kv_cache=slot)`` with a
:class:`~epochal.model.kv_cache.LayerKVCache` appends this call's keys/values
to the cache and attends over all cached tokens; the causal mask (and ALiBi's
distances) are offset by the number of tokens cached before the call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import CrossKVCache, LayerKVCache
from epochal.model.layers.norms import build_norm
from epochal.model.layers.packing import PackedSequences, packed_attention
from epochal.model.layers.positions import alibi_bias, alibi_slopes, apply_rotary

__all__ = ["Attention", "MASK_KINDS", "causal_mask_out", "padding_attention_mask"]

MASK_KINDS = ("causal", "bidirectional", "cross")


def padding_attention_mask(padding_mask: torch.Tensor) -> torch.Tensor:
    """The ``attention_mask`` that hides padded keys.

    Args:
        padding_mask: ``[b, s_k]``, nonzero/True = real token, 0/False = padding
            (Megatron's sample key ``padding_mask``).

    Returns:
        Bool ``[b, 1, 1, s_k]``, True = masked out (the convention of
        :meth:`Attention.forward`); broadcasts over heads and queries.

    Raises:
        ValueError: ``padding_mask`` is not two-dimensional.
    """
    if padding_mask.dim() != 2:
        raise ValueError(
            f"padding_mask must be [batch, seq], got shape {tuple(padding_mask.shape)}"
        )
    return ~padding_mask.bool()[:, None, None, :]


def causal_mask_out(
    seq_len: int, device: torch.device | None = None, key_length: int | None = None
) -> torch.Tensor:
    """Bool ``[s, s_k]``: True where the key is in the query's future, i.e. masked out.

    Args:
        seq_len: number of queries ``s``.
        device: where to build the mask.
        key_length: number of keys ``s_k >= s`` (default ``s``); the queries are the
            last ``s`` of the ``s_k`` positions (incremental decoding with a cache),
            so query ``i`` may see keys ``j <= i + s_k - s``.
    """
    s_k = seq_len if key_length is None else key_length
    return torch.ones(seq_len, s_k, dtype=torch.bool, device=device).triu(1 + s_k - seq_len)


class Attention(nn.Module):
    """Self- or cross-attention over ``[b, s, hidden]`` inputs.

    Args:
        config: the model config (heads, groups, head_dim, biases, dropout,
            position type).
        mask_kind: one of :data:`MASK_KINDS`; ``None`` = ``"causal"`` for GPT
            configs, ``"bidirectional"`` for encoder types.

    Raises:
        ValueError: an unknown ``mask_kind``, or ALiBi with a non-causal kind.
    """

    def __init__(self, config: ModelConfig, *, mask_kind: str | None = None) -> None:
        super().__init__()
        if mask_kind is None:
            mask_kind = "bidirectional" if config.is_encoder else "causal"
        if mask_kind not in MASK_KINDS:
            raise ValueError(f"mask_kind must be one of {MASK_KINDS}, got {mask_kind!r}")
        if mask_kind != "causal" and config.position_embedding_type == "alibi":
            raise ValueError(f"ALiBi is implemented for causal attention only, not {mask_kind!r}")
        self.mask_kind = mask_kind
        hd = config.head_dim
        self.head_dim = hd
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.dropout_p = config.attention_dropout
        self.wq = nn.Linear(config.hidden_size, self.num_heads * hd, bias=config.qkv_bias)
        self.wk = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.wv = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.wo = nn.Linear(self.num_heads * hd, config.hidden_size, bias=config.add_bias_linear)
        self.softmax_scale = config.softmax_scale
        #: QK-norm (``config.qk_layernorm``): norms over each head's ``head_dim`` channels,
        #: applied to queries and keys before the rotary embedding; ``None`` without.
        self.q_layernorm: nn.Module | None = None
        self.k_layernorm: nn.Module | None = None
        if config.qk_layernorm:
            self.q_layernorm = build_norm(config, hd)
            self.k_layernorm = build_norm(config, hd)
        #: causal only: each query sees itself and this many - 1 earlier keys (None: all).
        self.sliding_window = config.sliding_window
        #: slice of the global heads this module computes, for ``position_bias``
        #: (tensor parallelism); ``None`` = all heads.
        self.bias_heads: slice | None = None
        self.use_alibi = config.position_embedding_type == "alibi"
        #: slice of the global heads this module computes (ALiBi under tensor parallelism).
        self.alibi_heads: slice | None = None
        if self.use_alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(self.num_heads), persistent=False)
        else:
            self.alibi_slopes = None
        #: a replacement for the core attention of self-attention (module docstring); None = SDPA here.
        self.core_attention: Callable[..., torch.Tensor] | None = None

    def init_buffers(self) -> None:
        """(Re)compute the non-persistent ALiBi slopes on the parameters' device."""
        if not self.use_alibi:
            return
        slopes = alibi_slopes(self.num_heads, device=self.wq.weight.device)
        if self.alibi_heads is not None:
            slopes = slopes[self.alibi_heads]
        self.alibi_slopes = slopes

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: LayerKVCache | CrossKVCache | None = None,
        context: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        packed: PackedSequences | None = None,
    ) -> torch.Tensor:
        """Attend (causally, bidirectionally or to ``context``: see :attr:`mask_kind`).

        Args:
            x: ``[b, s, hidden]``.
            rope: ``(cos, sin)`` each ``[b or 1, s, rotary_dim]`` to rotate q and k, or None
                (self-attention only).
            attention_mask: optional bool ``[b or 1, 1, s or 1, s_k]``, True = masked
                out (Megatron's convention). Causal: always combined with the
                causal mask; ``s_k = s`` without a cache, ``offset + s`` with one.
                Bidirectional: ``s_k = s`` (e.g. :func:`padding_attention_mask`).
                Cross: ``s_k = s_ctx``. Every row must keep at least one key.
            kv_cache: causal: this layer's cache slot for incremental decoding; cross:
                a :class:`~epochal.model.generation.kv_cache.CrossKVCache` whose keys and
                values are computed from ``context`` once and reused; or None.
            context: cross only: the attended sequence ``[b, s_ctx, hidden]``.
            position_bias: optional float ``[1 or b, heads, s, s_k]`` added to the
                scaled scores (T5's relative bias; all heads, see :attr:`bias_heads`).
            packed: bidirectional only: ``x`` is ``[1, T, hidden]`` holding these
                packed sequences; attention stays within each (no ``attention_mask``,
                ``position_bias`` or cache then).

        Returns:
            ``[b, s, hidden]``.

        Raises:
            ValueError: ``context`` given or missing for the mask kind, ``rope``
                with cross-attention, a KV cache without causal attention, or
                ``packed`` with another mask kind or with a mask, bias or cache.
        """
        if (context is not None) != (self.mask_kind == "cross"):
            raise ValueError(
                f"{self.mask_kind} attention "
                + ("needs a context" if context is None else "takes no context")
            )
        if packed is not None:
            return self._forward_packed(x, rope, attention_mask, kv_cache, position_bias, packed)
        if self.mask_kind != "causal":
            return self._forward_noncausal(
                x, rope, attention_mask, kv_cache, context, position_bias
            )
        b, s, _ = x.shape
        q, k, v = self._self_qkv(x, rope)
        if self.core_attention is not None:
            return self._replaced_core(q, k, v, True, attention_mask, kv_cache, position_bias)
        out = self.causal_core(q, k, v, attention_mask, kv_cache, position_bias)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.wo(out)

    def causal_core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache: LayerKVCache | CrossKVCache | None = None,
        position_bias: torch.Tensor | None = None,
        heads: slice | None = None,
    ) -> torch.Tensor:
        """This module's causal attention of ``[b, heads, s, hd]`` queries (keys/values ``[b, kv_heads, s, hd]``).

        The computation :meth:`forward` runs without a replaced core (windows, ALiBi,
        bias, the cache's keys); a replaced core that only rearranges the heads (an
        all-to-all over ranks) calls it to compute what one process computes, with
        ``heads`` the slice of this module's heads its queries are (ALiBi's slopes;
        None: all of them). Returns ``[b, heads, s, hd]``.
        """
        s = q.shape[2]
        past = 0
        if kv_cache is not None:
            past = kv_cache.offset
            k, v = kv_cache.update(k, v)  # [b, kv_heads, past + s, hd]
        s_k = past + s
        window = self._window_mask_out(s, s_k, q.device)
        if window is not None:
            attention_mask = window if attention_mask is None else attention_mask | window
        # plain causal attention on the CPU: the kernel reads each key/value head for its
        # query heads itself (as transformers' SDPA path does), no repeated copies
        gqa = (
            past == 0
            and attention_mask is None
            and position_bias is None
            and not self.use_alibi
            and _native_gqa(q, k)
        )
        if not gqa:
            k, v = _repeat_kv(q, k, v)
        dropout_p = self.dropout_p if self.training else 0.0
        scale = self.softmax_scale
        if position_bias is not None:
            masked_out = causal_mask_out(s, device=q.device, key_length=s_k)
            if attention_mask is not None:
                masked_out = attention_mask | masked_out
            bias = self._bias(position_bias, masked_out, q.dtype)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale
            )
        elif self.use_alibi:
            slopes = self.alibi_slopes if heads is None else self.alibi_slopes[heads]
            bias = alibi_bias(slopes, s, dtype=q.dtype, mask=attention_mask, key_length=s_k)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale
            )
        elif attention_mask is not None:
            keep = ~(attention_mask | causal_mask_out(s, device=q.device, key_length=s_k))
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale
            )
        elif past == 0:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=gqa
            )
        elif s == 1:  # one new token sees every cached key
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        else:
            keep = ~causal_mask_out(s, device=q.device, key_length=s_k)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=scale
            )
        return out

    def _forward_noncausal(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor | None,
        kv_cache: LayerKVCache | CrossKVCache | None,
        context: torch.Tensor | None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Bidirectional self-attention or cross-attention (no causal mask; cross: a fixed cache)."""
        if kv_cache is not None and not (
            self.mask_kind == "cross" and isinstance(kv_cache, CrossKVCache)
        ):
            raise ValueError(
                f"{self.mask_kind} attention takes no KV cache (causal: a LayerKVCache; "
                "cross: a CrossKVCache)"
            )
        if context is not None and rope is not None:
            raise ValueError("cross attention takes no rotary positions")
        b, s, _ = x.shape
        hd = self.head_dim
        if self.core_attention is not None and context is None:
            q, k, v = self._self_qkv(x, rope)
            return self._replaced_core(q, k, v, False, attention_mask, kv_cache, position_bias)
        kv_in = x if context is None else context
        q = self.wq(x).view(b, s, -1, hd)
        if kv_cache is not None and kv_cache.keys is not None:  # cross: computed at step 0
            k, v = kv_cache.keys, kv_cache.values
        else:
            k = self.wk(kv_in).view(b, kv_in.shape[1], -1, hd)
            v = self.wv(kv_in).view(b, kv_in.shape[1], -1, hd)
            q, k = self._qk_norm(q, k)
            if rope is not None:
                cos, sin = rope
                q = apply_rotary(q, cos, sin)
                k = apply_rotary(k, cos, sin)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if kv_cache is not None:
                kv_cache.keys, kv_cache.values = k, v
        q = q.transpose(1, 2)
        if self.core_attention is not None and kv_cache is None:  # cross-attention
            return self._replaced_core(q, k, v, False, attention_mask, None, position_bias)
        out = self.bidirectional_core(q, k, v, attention_mask, position_bias)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def bidirectional_core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_bias: torch.Tensor | None = None,
        packed: PackedSequences | None = None,
    ) -> torch.Tensor:
        """This module's attention without a causal mask: ``[b, heads, s, hd]`` queries against
        ``[b, kv_heads, s_k, hd]`` keys/values (bidirectional self-attention, or cross-attention).

        The computation :meth:`forward` runs without a replaced core; ``packed``: ``s``
        is a packed row (``b = 1``) and each sequence attends within itself (no mask or
        bias then). A replaced core that only rearranges the heads (an all-to-all over
        ranks) calls it to compute what one process computes. Returns ``[b, heads, s, hd]``.
        """
        k, v = _repeat_kv(q, k, v)
        dropout_p = self.dropout_p if self.training else 0.0
        if packed is not None:
            return packed_attention(q, k, v, packed, dropout_p=dropout_p, scale=self.softmax_scale)
        if position_bias is not None:
            mask = self._bias(position_bias, attention_mask, q.dtype)
        else:
            mask = None if attention_mask is None else ~attention_mask
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.softmax_scale
        )

    def _replaced_core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        attention_mask: torch.Tensor | None,
        kv_cache: object,
        position_bias: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention through :attr:`core_attention` (no cache; no window or ALiBi unless the core
        declares ``takes_positions``: it attends with this module's own core over whole
        sequences, windows and ALiBi included).

        ``position_bias`` (this module's heads of it) reaches a core that declares
        ``takes_position_bias``, as its ``position_bias`` keyword; others refuse it.
        """
        whole = getattr(self.core_attention, "takes_positions", False)
        if kv_cache is not None or (self.use_alibi and not whole):
            raise ValueError("a replaced core attention takes no KV cache or ALiBi")
        if causal and self.sliding_window is not None and not whole:
            raise ValueError("a replaced core attention takes no sliding_window")
        assert self.core_attention is not None
        extra = {}
        if position_bias is not None:
            if not getattr(self.core_attention, "takes_position_bias", False):
                raise ValueError("this replaced core attention takes no position_bias")
            extra["position_bias"] = self._bias(position_bias, None, q.dtype)
        b, _, s, _ = q.shape
        out = self.core_attention(
            q,
            k,
            v,
            causal=causal,
            attention_mask=attention_mask,
            dropout_p=self.dropout_p if self.training else 0.0,
            scale=self.softmax_scale,
            **extra,
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def _self_qkv(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's queries, keys and values ``[b, heads, s, head_dim]``, rotated by ``rope``."""
        b, s, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(b, s, -1, hd)
        k = self.wk(x).view(b, s, -1, hd)
        v = self.wv(x).view(b, s, -1, hd)
        q, k = self._qk_norm(q, k)
        if rope is not None:
            cos, sin = rope
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm of ``[b, s, heads, head_dim]`` queries and keys (unchanged without it)."""
        if self.q_layernorm is None or self.k_layernorm is None:
            return q, k
        return self.q_layernorm(q), self.k_layernorm(k)

    def _window_mask_out(self, s: int, s_k: int, device: torch.device) -> torch.Tensor | None:
        """Bool ``[s, s_k]``, True where a key is ``sliding_window`` or more tokens back.

        The queries are the last ``s`` of the ``s_k`` positions (as in
        :func:`causal_mask_out`). ``None`` without a window, or when every key is
        within it (``s_k <= sliding_window``): then attention is plain causal.
        """
        w = self.sliding_window
        if w is None or s_k <= w:
            return None
        return torch.ones(s, s_k, dtype=torch.bool, device=device).tril(s_k - s - w)

    def _forward_packed(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        attention_mask: torch.Tensor | None,
        kv_cache: LayerKVCache | CrossKVCache | None,
        position_bias: torch.Tensor | None,
        packed: PackedSequences,
    ) -> torch.Tensor:
        """Bidirectional self-attention over packed sequences ``[1, T, hidden]``."""
        if self.mask_kind != "bidirectional":
            raise ValueError(f"packed sequences need bidirectional attention, not {self.mask_kind}")
        if attention_mask is not None or position_bias is not None or kv_cache is not None:
            raise ValueError(
                "packed sequences take no attention_mask, position_bias or kv_cache "
                "(attention is confined to each sequence)"
            )
        if self.sliding_window is not None:
            raise ValueError("packed sequences do not apply a sliding_window (unpack them)")
        if self.core_attention is not None:
            raise ValueError("packed sequences do not go through a replaced core attention")
        b, s, _ = x.shape
        q, k, v = self._self_qkv(x, rope)
        out = self.bidirectional_core(q, k, v, packed=packed)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def _bias(
        self, position_bias: torch.Tensor, masked_out: torch.Tensor | None, dtype: torch.dtype
    ) -> torch.Tensor:
        """The float SDPA mask: this module's heads of ``position_bias``, ``-inf`` where masked out."""
        if self.bias_heads is not None:
            position_bias = position_bias[:, self.bias_heads]
        bias = position_bias.to(dtype)
        if masked_out is not None:
            bias = bias.masked_fill(masked_out, float("-inf"))
        return bias


def _native_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Grouped keys/values go to SDPA as they are (``enable_gqa``): CPU kernels only.

    On CUDA the memory-efficient kernel (fp32, or flash disabled) does not take
    ``enable_gqa`` and would fall back to the math kernel, so there keys and values are
    repeated to the number of query heads first.
    """
    return q.device.type == "cpu" and q.shape[1] != k.shape[1] and q.shape[1] % k.shape[1] == 0


def _repeat_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat ``[b, kv_heads, s_k, hd]`` keys/values to ``q``'s head count (GQA / MQA)."""
    n_q, n_kv = q.shape[1], k.shape[1]
    if n_q == n_kv:
        return k, v
    rep = n_q // n_kv
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
