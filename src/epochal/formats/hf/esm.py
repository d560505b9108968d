"""Hugging Face ``EsmForMaskedLM`` (ESM-2) <-> epochal ``BertModel`` (``ModelConfig.type="esm"``).

Mapping (``L`` = layer index; the shared tables are :mod:`epochal.formats.hf.bert`'s)::

    esm.embeddings.word_embeddings.weight           <-> tok_embeddings.weight  (rows padded / cut)
    esm.encoder.layer.L.attention.LayerNorm.*       <-> layers.L.attention_norm.*
    esm.encoder.layer.L.attention.self.query/key/value.*  <-> layers.L.attention.wq/wk/wv.*
    esm.encoder.layer.L.attention.output.dense.*    <-> layers.L.attention.wo.*
    esm.encoder.layer.L.LayerNorm.*                 <-> layers.L.ffn_norm.*
    esm.encoder.layer.L.intermediate.dense.*        <-> layers.L.mlp.fc1.*
    esm.encoder.layer.L.output.dense.*              <-> layers.L.mlp.fc2.*
    esm.encoder.emb_layer_norm_after.*              <-> norm.*
    lm_head.dense.*                                 <-> lm_head.dense.*
    lm_head.layer_norm.*                            <-> lm_head.norm.*
    lm_head.bias                                    <-> lm_head.bias           (padded / cut)
    lm_head.decoder.weight                          <-> output.weight          (only when untied)

Configuration: ``position_embedding_type="rotary"`` (ESM-2; ESM-1b's absolute
positions and ``emb_layer_norm_before`` are refused), ``rope_theta`` <->
``rotary_base``, ``token_dropout``, ``mask_token_id`` and ``pad_token_id`` as they are (Hugging Face
ESM needs ``pad_token_id`` even with rotary positions, so export refuses a config
without it),
``hidden_dropout_prob`` / ``attention_probs_dropout_prob`` <-> the dropouts. ESM
uses the exact (erf) GELU, so ``activation`` must be ``"gelu"``.

Not converted: the contact-prediction head (``esm.contact_head.regression``, a
logistic regression over attention maps that plays no part in the masked-LM
logits) is dropped on import; on export it is written as zeros (an untrained head:
every contact probability 0.5) so that the folder loads without missing tensors.
The rotary ``inv_freq`` buffer is ignored on import (recomputed from
``rotary_base``) and written on export.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from epochal.formats.common import ConversionError, normalize_config
from epochal.formats.hf.bert import (
    EncoderLayout,
    encoder_state_from_ours,
    optional_id,
    ours_state_from_encoder,
)
from epochal.model.config import ModelConfig
from epochal.model.layers.positions import rope_inv_freq

__all__ = [
    "ESM",
    "esm_config_from_ours",
    "esm_state_from_ours",
    "ours_config_from_esm",
    "ours_state_from_esm",
]

ESM = EncoderLayout(
    prefix="esm.",
    embedding_norm=None,
    attention_norm="attention.LayerNorm",
    ffn_norm="LayerNorm",
    final_norm="encoder.emb_layer_norm_after",
    head_dense="lm_head.dense",
    head_norm="lm_head.layer_norm",
    head_bias="lm_head.bias",
    decoder="lm_head.decoder.weight",
    decoder_bias=None,
    ignored=("embeddings.position_ids", "rotary_embeddings.inv_freq"),
)
_CONTACT_HEAD = "esm.contact_head."


def ours_config_from_esm(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` (``type="esm"``) from an ``esm`` ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly.
    """
    position = hf.get("position_embedding_type", "absolute")
    if position != "rotary":
        raise ConversionError(
            f"config.json: position_embedding_type={position!r} is not supported "
            "(ESM-2's 'rotary' only)"
        )
    for key in ("emb_layer_norm_before", "is_folding_model", "is_decoder", "add_cross_attention"):
        if hf.get(key):
            raise ConversionError(f"config.json: {key}=true is not supported by epochal's ESM")
    if (
        hf.get("rope_scaling")
        or (hf.get("rope_parameters") or {}).get("rope_type", "default") != "default"
    ):
        raise ConversionError("config.json: RoPE scaling is not supported for ESM")
    theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    config = ModelConfig(
        type="esm",
        vocab_size=int(hf["vocab_size"]),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        hidden_size=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=int(hf["num_attention_heads"]),
        ffn_hidden_size=int(hf["intermediate_size"]),
        max_position_embeddings=int(hf["max_position_embeddings"]),
        position_embedding_type="rope",
        rotary_base=float(theta),
        normalization="LayerNorm",
        norm_epsilon=float(hf.get("layer_norm_eps", 1e-12)),
        activation="gelu",
        add_bias_linear=True,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", True),
        hidden_dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        num_tokentypes=0,
        token_dropout=bool(hf.get("token_dropout", False)),
        mask_token_id=optional_id(hf, "mask_token_id"),
        pad_token_id=optional_id(hf, "pad_token_id"),
    )
    return normalize_config(config)


def esm_config_from_ours(config: ModelConfig) -> dict[str, Any]:
    """An ``EsmForMaskedLM`` ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not an ESM model, or uses something
            Hugging Face's ESM does not have.
    """
    if config.type != "esm":
        raise ConversionError(
            f"model.type={config.type!r}: ESM export needs an 'esm' model "
            "(GPT exports as gpt2/llama, BERT as bert/megatron-bert)"
        )
    problems = []
    if config.rotary_percent != 1.0 or config.rope_scaling_type is not None:
        problems.append("partial or scaled RoPE")
    if config.normalization != "LayerNorm" or config.activation != "gelu":
        problems.append(f"{config.normalization} / {config.activation} (needs LayerNorm / gelu)")
    if config.num_kv_heads != config.num_attention_heads:
        problems.append("grouped-query attention")
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        problems.append(f"kv_channels={config.kv_channels}")
    if not (config.add_bias_linear and config.qkv_bias):
        problems.append("linear layers without biases")
    if config.pad_token_id is None:
        problems.append("no pad_token_id (Hugging Face ESM needs it; ESM-2's alphabet: 1)")
    if problems:
        raise ConversionError("Hugging Face ESM cannot represent: " + "; ".join(problems))
    return {
        "architectures": ["EsmForMaskedLM"],
        "model_type": "esm",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.ffn_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "position_embedding_type": "rotary",
        "rope_theta": config.rotary_base,
        "initializer_range": config.init_method_std,
        "layer_norm_eps": config.norm_epsilon,
        "emb_layer_norm_before": False,
        "token_dropout": config.token_dropout,
        "mask_token_id": config.mask_token_id,
        "pad_token_id": config.pad_token_id,
        "tie_word_embeddings": config.tie_embeddings,
    }


def ours_state_from_esm(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str = "checkpoint"
) -> dict[str, torch.Tensor]:
    """Convert an ``EsmForMaskedLM`` state dict to our names (the contact head is dropped).

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    return ours_state_from_encoder(hf_state, config, ESM, source=source, dropped=(_CONTACT_HEAD,))


def esm_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Convert our state dict to ``EsmForMaskedLM`` names (plus a zero contact head)."""
    esm_config_from_ours(config)  # validates
    out = encoder_state_from_ours(state, config, ESM)
    dtype = state["tok_embeddings.weight"].dtype
    features = config.num_layers * config.num_attention_heads
    out[_CONTACT_HEAD + "regression.weight"] = torch.zeros(1, features, dtype=dtype)
    out[_CONTACT_HEAD + "regression.bias"] = torch.zeros(1, dtype=dtype)
    out["esm.rotary_embeddings.inv_freq"] = rope_inv_freq(config.head_dim, config.rotary_base)
    return out
