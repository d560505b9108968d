"""Causal self-attention: multi-head, multi-query and grouped-query, on SDPA.

Parameters (names are stable; the tensor-parallel plan and the checkpoint
converters rely on them):

- ``wq``: ``nn.Linear(hidden, num_attention_heads * head_dim, bias=qkv_bias)``
- ``wk``, ``wv``: ``nn.Linear(hidden, num_query_groups * head_dim, bias=qkv_bias)``
- ``wo``: ``nn.Linear(num_attention_heads * head_dim, hidden, bias=add_bias_linear)``
- buffer ``alibi_slopes`` (ALiBi only, non-persistent): ``[heads computed here]``

Tensor-parallel friendliness: head counts are derived in ``forward`` from the
projected tensors' shapes (``view(b, s, -1, head_dim)``), and the GQA repeat
factor is ``local q heads // local kv heads``, so column-sharded q/k/v and
row-sharded ``wo`` work unchanged. Query head ``i`` uses key/value group
``i // (q heads / kv heads)`` (Megatron's and Hugging Face's grouping). For ALiBi
under tensor parallelism set :attr:`Attention.alibi_heads` to this rank's
slice of heads and call :meth:`Attention.init_buffers`.

Incremental decoding: ``forward(..., kv_cache=slot)`` with a
:class:`~epochal.model.kv_cache.LayerKVCache` appends this call's keys/values
to the cache and attends over all cached tokens; the causal mask (and ALiBi's
distances) are offset by the number of tokens cached before the call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import LayerKVCache
from epochal.model.layers.positions import alibi_bias, alibi_slopes, apply_rotary

__all__ = ["Attention", "causal_mask_out"]


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
    """Causal self-attention over ``[b, s, hidden]`` inputs.

    Args:
        config: the model config (heads, groups, head_dim, biases, dropout,
            position type).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hd = config.head_dim
        self.head_dim = hd
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_kv_heads
        self.dropout_p = config.attention_dropout
        self.wq = nn.Linear(config.hidden_size, self.num_heads * hd, bias=config.qkv_bias)
        self.wk = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.wv = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=config.qkv_bias)
        self.wo = nn.Linear(self.num_heads * hd, config.hidden_size, bias=config.add_bias_linear)
        self.use_alibi = config.position_embedding_type == "alibi"
        #: slice of the global heads this module computes (ALiBi under tensor parallelism).
        self.alibi_heads: slice | None = None
        if self.use_alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(self.num_heads), persistent=False)
        else:
            self.alibi_slopes = None

    def init_buffers(self) -> None:
        """(Re)compute the non-persistent ALiBi slopes on the parameters' device."""
        if not self.use_alibi:
            return
        slopes = alibi_slopes(self.num_heads)
        if self.alibi_heads is not None:
            slopes = slopes[self.alibi_heads]
        self.alibi_slopes = slopes.to(device=self.wq.weight.device)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: LayerKVCache | None = None,
    ) -> torch.Tensor:
        """Attend causally.

        Args:
            x: ``[b, s, hidden]``.
            rope: ``(cos, sin)`` each ``[b or 1, s, rotary_dim]`` to rotate q and k, or None.
            attention_mask: optional bool ``[b or 1, 1, s, s_k]``, True = masked
                out (Megatron's convention); always combined with the causal
                mask. Every row must keep at least one key (the diagonal).
                ``s_k = s`` without a cache, ``offset + s`` with one.
            kv_cache: this layer's cache slot for incremental decoding, or None.

        Returns:
            ``[b, s, hidden]``.
        """
        b, s, _ = x.shape
        hd = self.head_dim
        q = self.wq(x).view(b, s, -1, hd)
        k = self.wk(x).view(b, s, -1, hd)
        v = self.wv(x).view(b, s, -1, hd)
        if rope is not None:
            cos, sin = rope
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, s, hd]
        past = 0
        if kv_cache is not None:
            past = kv_cache.offset
            k, v = kv_cache.update(k, v)  # [b, kv_heads, past + s, hd]
        s_k = past + s
        n_q, n_kv = q.shape[1], k.shape[1]
        if n_q != n_kv:
            rep = n_q // n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        dropout_p = self.dropout_p if self.training else 0.0
        if self.use_alibi:
            bias = alibi_bias(
                self.alibi_slopes, s, dtype=q.dtype, mask=attention_mask, key_length=s_k
            )
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
        elif attention_mask is not None:
            keep = ~(attention_mask | causal_mask_out(s, device=q.device, key_length=s_k))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
        elif past == 0:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        elif s == 1:  # one new token sees every cached key
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        else:
            keep = ~causal_mask_out(s, device=q.device, key_length=s_k)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout_p)
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.wo(out)
