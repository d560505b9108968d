"""Model FLOPs per token, for throughput and MFU reports.

Uses the PaLM convention (Chowdhery et al. 2022, appendix B): a training step
costs ``6 * N + 12 * L * (heads * head_dim) * s`` FLOPs per token, where ``N``
counts the parameters that take part in matrix multiplies (every block linear and
the output head, plus an encoder's masked-LM transform ``lm_head.dense``; not the
embedding lookups, norms, biases or the per-sequence pooler/binary head; in a
mixture-of-experts block the router and the ``moe_router_topk`` experts a token goes
through, plus the shared expert: the active parameters) and the second term
is the attention score/value products (not halved for causality).

For T5 a "token" is one encoder token plus one decoder token (equal lengths
``seq_length``): every encoder and decoder block is counted, cross-attention too.
"""

from __future__ import annotations

from epochal.model.config import ModelConfig
from epochal.model.moe_options import moe_layer_pattern

__all__ = ["matmul_parameters", "training_flops_per_token"]


def matmul_parameters(config: ModelConfig) -> int:
    """Number of weights used in matrix multiplies per token (blocks + head)."""
    h, hd = config.hidden_size, config.head_dim
    attn = h * hd * (2 * config.num_attention_heads + 2 * config.num_kv_heads)
    n_mats = 3 if config.activation in ("swiglu", "gated_gelu") else 2
    mlp = n_mats * h * config.ffn_size
    head = h * config.padded_vocab_size + (h * h if config.is_encoder else 0)
    if config.type == "t5":  # encoder blocks + decoder blocks (with cross-attention)
        return config.num_blocks * (attn + mlp) + config.num_decoder_layers * attn + head
    if config.num_experts is not None:  # MoE blocks: the router and the active experts only
        moe = h * config.num_experts + config.moe_router_topk * n_mats * h * config.moe_ffn_size
        if config.moe_shared_expert_intermediate_size is not None:
            moe += n_mats * h * config.moe_shared_expert_intermediate_size
            moe += h if config.moe_shared_expert_gate else 0
        sparse = sum(moe_layer_pattern(config.moe_layer_freq, config.num_layers))
        return config.num_layers * attn + sparse * moe + (config.num_layers - sparse) * mlp + head
    return config.num_layers * (attn + mlp) + head


def training_flops_per_token(config: ModelConfig, seq_length: int) -> float:
    """Forward + backward FLOPs per token of a training step at sequence length ``seq_length``."""
    attn = 12 * config.num_blocks * config.num_attention_heads * config.head_dim * seq_length
    return 6.0 * matmul_parameters(config) + attn
