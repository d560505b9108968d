"""One transformer block, pre-norm or post-norm.

Pre-norm (GPT, Megatron's BERT, ESM-2; ``transformer_block_type="pre_ln"``)::

    h = x + dropout(attention(attention_norm(x)));  out = h + dropout(mlp(ffn_norm(h)))

Post-norm (original BERT, Hugging Face ``BertModel``; ``"post_ln"``)::

    h = attention_norm(x + dropout(attention(x)));  out = ffn_norm(h + dropout(mlp(h)))

Submodules (stable names): ``attention_norm``, ``attention``
(:class:`~epochal.model.attention.Attention`), ``ffn_norm``, ``mlp``
(:class:`~epochal.model.mlp.MLP`), ``dropout`` (hidden dropout, shared by both
residual branches; it holds no state).

:class:`DecoderBlock` (T5's decoder; pre-norm) adds cross-attention to an
encoder's output between the two::

    h = x + dropout(attention(attention_norm(x)))                    causal
    h = h + dropout(cross_attention(cross_attention_norm(h), context))
    out = h + dropout(mlp(ffn_norm(h)))

with the extra submodules ``cross_attention_norm`` and ``cross_attention``
(an :class:`~epochal.model.attention.Attention` of mask kind ``"cross"``).
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import KVCache
from epochal.model.layers.attention import Attention
from epochal.model.layers.mlp import MLP
from epochal.model.layers.moe import MoEMLP
from epochal.model.layers.norms import build_norm
from epochal.model.layers.packing import PackedSequences
from epochal.model.moe_options import is_moe_layer

__all__ = ["DecoderBlock", "TransformerBlock"]


class TransformerBlock(nn.Module):
    """Attention + MLP block over ``[b, s, hidden]`` (pre- or post-norm, from the config).

    Args:
        config: the model config.
        layer_id: the block's global index (0-based), kept for plans and logs.
        mask_kind: the self-attention's mask kind (see
            :class:`~epochal.model.attention.Attention`); ``None`` = the config's default.
    """

    def __init__(self, config: ModelConfig, layer_id: int, *, mask_kind: str | None = None) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.post_norm = config.transformer_block_type == "post_ln"
        self.attention_norm = build_norm(config)
        self.attention = Attention(config, mask_kind=mask_kind)
        self.ffn_norm = build_norm(config)
        #: the dense MLP, or the mixture of experts in the config's MoE blocks
        self.mlp = MoEMLP(config, layer_id) if is_moe_layer(config, layer_id) else MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        position_bias: torch.Tensor | None = None,
        packed: PackedSequences | None = None,
    ) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``; see :meth:`Attention.forward` for the arguments.

        ``kv_cache`` is the model-wide cache; the block uses its slot ``layer_id``.
        """
        slot = None if kv_cache is None else kv_cache.layer(self.layer_id)
        if self.post_norm:
            attn = self.attention(
                x, rope, attention_mask, kv_cache=slot, position_bias=position_bias, packed=packed
            )
            h = self.attention_norm(x + self.dropout(attn))
            return self.ffn_norm(h + self.dropout(self.mlp(h)))
        attn = self.attention(
            self.attention_norm(x),
            rope,
            attention_mask,
            kv_cache=slot,
            position_bias=position_bias,
            packed=packed,
        )
        h = x + self.dropout(attn)
        return h + self.dropout(self.mlp(self.ffn_norm(h)))


class DecoderBlock(nn.Module):
    """Causal self-attention + cross-attention + MLP over ``[b, s, hidden]`` (pre-norm; T5).

    Args:
        config: the model config.
        layer_id: the block's global index (0-based; a T5 model numbers its
            decoder blocks after the encoder's), kept for plans, logs and the KV cache.
    """

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = build_norm(config)
        self.attention = Attention(config, mask_kind="causal")
        self.cross_attention_norm = build_norm(config)
        self.cross_attention = Attention(config, mask_kind="cross")
        self.ffn_norm = build_norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        context_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        position_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``.

        Args:
            x: the decoder's hidden states ``[b, s, hidden]``.
            context: the encoder's output ``[b, s_ctx, hidden]``.
            attention_mask: optional bool ``[b or 1, 1, s or 1, s_k]`` for the
                self-attention (True = masked out; combined with the causal mask).
            context_mask: optional bool ``[b or 1, 1, 1, s_ctx]`` hiding padded
                encoder positions from the cross-attention.
            kv_cache: the model-wide cache: the self-attention's slot ``layer_id`` and
                the cross-attention's keys/values (computed from ``context`` once).
            position_bias: optional float ``[1 or b, heads, s, s_k]`` for the
                self-attention (T5's relative bias).
        """
        slot = None if kv_cache is None else kv_cache.layer(self.layer_id)
        attn = self.attention(
            self.attention_norm(x),
            None,
            attention_mask,
            kv_cache=slot,
            position_bias=position_bias,
        )
        h = x + self.dropout(attn)
        cross_slot = None if kv_cache is None else kv_cache.cross_layer(self.layer_id)
        cross = self.cross_attention(
            self.cross_attention_norm(h), None, context_mask, kv_cache=cross_slot, context=context
        )
        h = h + self.dropout(cross)
        return h + self.dropout(self.mlp(self.ffn_norm(h)))
