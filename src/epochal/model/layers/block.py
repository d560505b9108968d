"""One transformer block, pre-norm or post-norm.

Pre-norm (GPT, Megatron's BERT, ESM-2; ``transformer_block_type="pre_ln"``)::

    h = x + dropout(attention(attention_norm(x)));  out = h + dropout(mlp(ffn_norm(h)))

Post-norm (original BERT, Hugging Face ``BertModel``; ``"post_ln"``)::

    h = attention_norm(x + dropout(attention(x)));  out = ffn_norm(h + dropout(mlp(h)))

Submodules (stable names): ``attention_norm``, ``attention``
(:class:`~epochal.model.attention.Attention`), ``ffn_norm``, ``mlp``
(:class:`~epochal.model.mlp.MLP`), ``dropout`` (hidden dropout, shared by both
residual branches; it holds no state).
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.generation.kv_cache import KVCache
from epochal.model.layers.attention import Attention
from epochal.model.layers.mlp import MLP
from epochal.model.layers.norms import build_norm

__all__ = ["TransformerBlock"]


class TransformerBlock(nn.Module):
    """Attention + MLP block over ``[b, s, hidden]`` (pre- or post-norm, from the config).

    Args:
        config: the model config.
        layer_id: the block's global index (0-based), kept for plans and logs.
    """

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.post_norm = config.transformer_block_type == "post_ln"
        self.attention_norm = build_norm(config)
        self.attention = Attention(config)
        self.ffn_norm = build_norm(config)
        self.mlp = MLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> torch.Tensor:
        """``[b, s, hidden] -> [b, s, hidden]``; see :meth:`Attention.forward` for the arguments.

        ``kv_cache`` is the model-wide cache; the block uses its slot ``layer_id``.
        """
        slot = None if kv_cache is None else kv_cache.layer(self.layer_id)
        if self.post_norm:
            attn = self.attention(x, rope, attention_mask, kv_cache=slot)
            h = self.attention_norm(x + self.dropout(attn))
            return self.ffn_norm(h + self.dropout(self.mlp(h)))
        attn = self.attention(self.attention_norm(x), rope, attention_mask, kv_cache=slot)
        h = x + self.dropout(attn)
        return h + self.dropout(self.mlp(self.ffn_norm(h)))
