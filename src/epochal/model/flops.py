"""Model FLOPs per token, for throughput and MFU reports.

Uses the PaLM convention (Chowdhery et al. 2022, appendix B): a training step
costs ``6 * N + 12 * L * (heads * head_dim) * s`` FLOPs per token, where ``N``
counts the parameters that take part in matrix multiplies (every block linear and
the output head, plus an encoder's masked-LM transform ``lm_head.dense``; not the
embedding lookups, norms, biases or the per-sequence pooler/binary head) and the second term
is the attention score/value products (not halved for causality).
"""

from __future__ import annotations

from epochal.model.config import ModelConfig

__all__ = ["matmul_parameters", "training_flops_per_token"]


def matmul_parameters(config: ModelConfig) -> int:
    """Number of weights used in matrix multiplies per token (blocks + head)."""
    h, hd = config.hidden_size, config.head_dim
    attn = h * hd * (2 * config.num_attention_heads + 2 * config.num_kv_heads)
    n_mats = 3 if config.activation == "swiglu" else 2
    mlp = n_mats * h * config.ffn_size
    head = h * config.padded_vocab_size + (h * h if config.is_encoder else 0)
    return config.num_layers * (attn + mlp) + head


def training_flops_per_token(config: ModelConfig, seq_length: int) -> float:
    """Forward + backward FLOPs per token of a training step at sequence length ``seq_length``."""
    attn = 12 * config.num_layers * config.num_attention_heads * config.head_dim * seq_length
    return 6.0 * matmul_parameters(config) + attn
