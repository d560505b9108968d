"""Hugging Face ``T5ForConditionalGeneration`` / ``MT5ForConditionalGeneration`` <-> ``T5Model``.

Mapping (``i`` = encoder block, ``j`` = decoder block, ``E`` = encoder blocks;
our decoder blocks are ``layers.{E + j}``)::

    shared.weight                                       <-> tok_embeddings.weight (rows padded / cut)
    encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight
                                                        <-> encoder_relative_bias.weight
    decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight
                                                        <-> decoder_relative_bias.weight
    encoder.block.i.layer.0.layer_norm.weight           <-> layers.i.attention_norm.weight
    encoder.block.i.layer.0.SelfAttention.{q,k,v,o}     <-> layers.i.attention.w{q,k,v,o}
    encoder.block.i.layer.1.layer_norm.weight           <-> layers.i.ffn_norm.weight
    encoder.block.i.layer.1.DenseReluDense.wi / wo      <-> layers.i.mlp.fc1 / fc2          (relu)
    encoder.block.i.layer.1.DenseReluDense.wi_0/wi_1/wo <-> layers.i.mlp.w1 / w3 / w2      (gated-gelu)
    decoder.block.j.layer.0.*                           <-> layers.{E+j}.attention_norm / attention
    decoder.block.j.layer.1.layer_norm.weight           <-> layers.{E+j}.cross_attention_norm.weight
    decoder.block.j.layer.1.EncDecAttention.{q,k,v,o}   <-> layers.{E+j}.cross_attention.w{q,k,v,o}
    decoder.block.j.layer.2.*                           <-> layers.{E+j}.ffn_norm / mlp
    encoder.final_layer_norm.weight                     <-> encoder_norm.weight
    decoder.final_layer_norm.weight                     <-> decoder_norm.weight
    lm_head.weight                                      <-> output.weight (untied; rows padded / cut)

Configuration: ``relative`` positions, RMSNorm (``layer_norm_epsilon``), no linear
biases, ``softmax_scale=1.0``; ``feed_forward_proj`` ``"relu"`` (T5 v1.0) or
``"gated-gelu"`` (v1.1 / mT5; the tanh GELU) <-> ``activation`` ``"relu"`` /
``"gated_gelu"``; ``d_kv`` <-> ``kv_channels``; ``dropout_rate`` <-> both dropouts.

The head: Hugging Face T5 multiplies the decoder output by ``d_model ** -0.5``
when the config says ``tie_word_embeddings`` (transformers >= 5 records it as
``scale_decoder_outputs`` and always ties, unless the file holds a different
``lm_head.weight``). On import the head is tied iff ``lm_head.weight`` is absent
or equal to ``shared.weight``, and the scaling follows ``scale_decoder_outputs``
(else ``tie_word_embeddings``). On export ``tie_word_embeddings`` is the scaling
and ``lm_head.weight`` is written whenever the scaling is off, so every
transformers version reads the same logits; an untied head WITH the scaling has
no such file and is refused. mT5 never scales (official mT5 files say
``tie_word_embeddings=false``; transformers >= 5 ignores the flag for mT5), so an
``mt5`` config is read unscaled and a scaled model is not exported as ``mt5``.

Ignored on import: ``encoder.embed_tokens.weight`` / ``decoder.embed_tokens.weight``
(copies of ``shared.weight``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from epochal.formats.common import ConversionError, check_keys, normalize_config, resize_rows
from epochal.model.config import ModelConfig

__all__ = [
    "ours_config_from_t5",
    "ours_state_from_t5",
    "t5_config_from_ours",
    "t5_state_from_ours",
]

_ACTIVATIONS = {"relu": "relu", "gated-gelu": "gated_gelu"}
_IGNORED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def _hf_tied(weights: Mapping[str, torch.Tensor]) -> bool:
    head = weights.get("lm_head.weight")
    return head is None or (
        head.shape == weights["shared.weight"].shape and torch.equal(head, weights["shared.weight"])
    )


def ours_config_from_t5(
    hf: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
    *,
    make_vocab_size_divisible_by: int = 128,
) -> ModelConfig:
    """Our :class:`ModelConfig` (``type="t5"``) from a ``t5`` / ``mt5`` ``config.json`` dict.

    Args:
        hf: the ``config.json`` dict.
        weights: the Hugging Face state dict (decides whether the head is tied).
        make_vocab_size_divisible_by: our vocabulary padding multiple.

    Raises:
        ConversionError: a feed-forward type or option our model cannot reproduce.
    """
    proj = hf.get("feed_forward_proj", "relu")
    if proj not in _ACTIVATIONS:
        raise ConversionError(
            f"config.json: feed_forward_proj={proj!r} is not supported "
            f"(one of {sorted(_ACTIVATIONS)})"
        )
    if "shared.weight" not in weights:
        raise ConversionError("T5 weights: missing tensor 'shared.weight'")
    tied = _hf_tied(weights)
    if hf.get("model_type") == "mt5":  # official mT5 files and transformers >= 5: never scaled
        scale = hf.get("scale_decoder_outputs", False)
    else:
        scale = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    num_layers = int(hf["num_layers"])
    decoder_layers = int(hf.get("num_decoder_layers") or num_layers)
    dropout = float(hf.get("dropout_rate", 0.1))
    pad = hf.get("pad_token_id")
    config = ModelConfig(
        type="t5",
        vocab_size=int(hf["vocab_size"]),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        hidden_size=int(hf["d_model"]),
        kv_channels=int(hf["d_kv"]),
        ffn_hidden_size=int(hf["d_ff"]),
        num_layers=num_layers,
        decoder_num_layers=None if decoder_layers == num_layers else decoder_layers,
        num_attention_heads=int(hf["num_heads"]),
        # relative positions have no length limit; 512 is T5's pre-training length
        max_position_embeddings=int(hf.get("n_positions", 512)),
        position_embedding_type="relative",
        relative_attention_num_buckets=int(hf.get("relative_attention_num_buckets", 32)),
        relative_attention_max_distance=int(hf.get("relative_attention_max_distance", 128)),
        normalization="RMSNorm",
        norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-6)),
        activation=_ACTIVATIONS[proj],
        add_bias_linear=False,
        softmax_scale=1.0,
        untie_embeddings_and_output_weights=not tied,
        scale_decoder_output=bool(scale),
        hidden_dropout=dropout,
        attention_dropout=dropout,
        pad_token_id=None if pad is None else int(pad),
    )
    return normalize_config(config)


def t5_config_from_ours(config: ModelConfig, *, architecture: str = "t5") -> dict[str, Any]:
    """A ``T5ForConditionalGeneration`` (or ``mt5``) ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not a T5 model, or uses something Hugging
            Face's T5 does not have (each problem is named).
    """
    if config.type != "t5":
        raise ConversionError(
            f"model.type={config.type!r}: T5 export needs a 't5' model "
            "(GPT exports as gpt2/llama, BERT as bert/megatron-bert, ESM as esm)"
        )
    problems = []
    if config.position_embedding_type != "relative":
        problems.append(
            f"position_embedding_type={config.position_embedding_type!r} (needs 'relative')"
        )
    if config.normalization != "RMSNorm":
        problems.append(f"normalization={config.normalization!r} (needs RMSNorm)")
    if config.activation not in ("relu", "gated_gelu"):
        problems.append(f"activation={config.activation!r} (needs relu or gated_gelu)")
    if config.add_bias_linear or config.qkv_bias or config.output_bias:
        problems.append("biases on linear layers or the output head")
    if config.softmax_scale != 1.0:
        problems.append(f"softmax_scale={config.softmax_scale!r} (needs 1.0)")
    if config.num_kv_heads != config.num_attention_heads:
        problems.append("grouped-query attention")
    if not config.tie_embeddings and config.scale_decoder_output:
        problems.append("an untied head with scale_decoder_output=true")
    if architecture == "mt5" and config.scale_decoder_output:
        problems.append("scale_decoder_output=true (mT5 never scales; use architecture 't5')")
    if problems:
        raise ConversionError("Hugging Face T5 cannot represent: " + "; ".join(problems))
    proj = {v: k for k, v in _ACTIVATIONS.items()}[config.activation]
    pad = 0 if config.pad_token_id is None else config.pad_token_id
    return {
        "architectures": [
            "MT5ForConditionalGeneration" if architecture == "mt5" else "T5ForConditionalGeneration"
        ],
        "model_type": architecture,
        "vocab_size": config.vocab_size,
        "d_model": config.hidden_size,
        "d_kv": config.head_dim,
        "d_ff": config.ffn_size,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_attention_heads,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "dropout_rate": config.hidden_dropout,
        "layer_norm_epsilon": config.norm_epsilon,
        "feed_forward_proj": proj,
        "is_gated_act": proj.startswith("gated"),
        "dense_act_fn": "gelu_new" if proj == "gated-gelu" else "relu",
        "tie_word_embeddings": config.scale_decoder_output,
        "is_encoder_decoder": True,
        "pad_token_id": pad,
        "decoder_start_token_id": pad,
        "eos_token_id": 1,
    }


def _pairs(config: ModelConfig) -> list[tuple[str, str]]:
    """``(hugging face name, our name)`` for every tensor but the embeddings and the head."""
    gated = config.activation == "gated_gelu"
    mlp = (
        [("wi_0", "w1"), ("wi_1", "w3"), ("wo", "w2")] if gated else [("wi", "fc1"), ("wo", "fc2")]
    )
    n_enc = config.num_encoder_layers
    pairs: list[tuple[str, str]] = []
    for i in range(n_enc):
        src, dst = f"encoder.block.{i}.layer", f"layers.{i}"
        pairs.append((f"{src}.0.layer_norm.weight", f"{dst}.attention_norm.weight"))
        pairs += [
            (f"{src}.0.SelfAttention.{x}.weight", f"{dst}.attention.w{x}.weight") for x in "qkvo"
        ]
        pairs.append((f"{src}.1.layer_norm.weight", f"{dst}.ffn_norm.weight"))
        pairs += [(f"{src}.1.DenseReluDense.{a}.weight", f"{dst}.mlp.{b}.weight") for a, b in mlp]
    for j in range(config.num_decoder_layers):
        src, dst = f"decoder.block.{j}.layer", f"layers.{n_enc + j}"
        pairs.append((f"{src}.0.layer_norm.weight", f"{dst}.attention_norm.weight"))
        pairs += [
            (f"{src}.0.SelfAttention.{x}.weight", f"{dst}.attention.w{x}.weight") for x in "qkvo"
        ]
        pairs.append((f"{src}.1.layer_norm.weight", f"{dst}.cross_attention_norm.weight"))
        pairs += [
            (f"{src}.1.EncDecAttention.{x}.weight", f"{dst}.cross_attention.w{x}.weight")
            for x in "qkvo"
        ]
        pairs.append((f"{src}.2.layer_norm.weight", f"{dst}.ffn_norm.weight"))
        pairs += [(f"{src}.2.DenseReluDense.{a}.weight", f"{dst}.mlp.{b}.weight") for a, b in mlp]
    rel = "block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    pairs.append((f"encoder.{rel}", "encoder_relative_bias.weight"))
    pairs.append((f"decoder.{rel}", "decoder_relative_bias.weight"))
    pairs.append(("encoder.final_layer_norm.weight", "encoder_norm.weight"))
    pairs.append(("decoder.final_layer_norm.weight", "decoder_norm.weight"))
    return pairs


def ours_state_from_t5(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str = "checkpoint"
) -> dict[str, torch.Tensor]:
    """Convert a ``T5ForConditionalGeneration`` state dict to our names.

    Raises:
        ConversionError: a tensor is missing or unexpected (named, with ``source``).
    """
    pairs = _pairs(config)
    expected = [hf for hf, _ in pairs] + ["shared.weight"]
    present = [k for k in hf_state if k not in _IGNORED and k != "lm_head.weight"]
    check_keys(present, expected, source)
    rows = config.padded_vocab_size
    state = {ours: hf_state[hf] for hf, ours in pairs}
    state["tok_embeddings.weight"] = resize_rows(hf_state["shared.weight"], rows)
    if config.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    else:
        if "lm_head.weight" not in hf_state:
            raise ConversionError(f"{source}: missing tensor 'lm_head.weight' (untied head)")
        state["output.weight"] = resize_rows(hf_state["lm_head.weight"], rows)
    return state


def t5_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Convert our state dict to ``T5ForConditionalGeneration`` names (see the module docstring)."""
    t5_config_from_ours(config)  # validates
    out = {hf: state[ours] for hf, ours in _pairs(config)}
    out["shared.weight"] = resize_rows(state["tok_embeddings.weight"], config.vocab_size)
    if not config.scale_decoder_output:
        out["lm_head.weight"] = resize_rows(state["output.weight"], config.vocab_size)
    return out
