"""Hugging Face ``BertForMaskedLM`` / ``BertForPreTraining`` / ``MegatronBertForPreTraining``
<-> epochal ``BertModel`` (``ModelConfig.type="bert"``).

Mapping (``L`` = layer index, ``p`` = ``bert.``; ``MegatronBert`` names in brackets)::

    p.embeddings.word_embeddings.weight          <-> tok_embeddings.weight   (rows padded / cut)
    p.embeddings.position_embeddings.weight      <-> pos_embeddings.weight
    p.embeddings.token_type_embeddings.weight    <-> tokentype_embeddings.weight
    p.embeddings.LayerNorm.*   [none]            <-> embedding_norm.*        (post_ln only)
    p.encoder.layer.L.attention.self.query.*     <-> layers.L.attention.wq.*
    p.encoder.layer.L.attention.self.key.*       <-> layers.L.attention.wk.*
    p.encoder.layer.L.attention.self.value.*     <-> layers.L.attention.wv.*
    p.encoder.layer.L.attention.output.dense.*   <-> layers.L.attention.wo.*
    p.encoder.layer.L.attention.output.LayerNorm.*  [attention.ln.*]  <-> layers.L.attention_norm.*
    p.encoder.layer.L.intermediate.dense.*       <-> layers.L.mlp.fc1.*
    p.encoder.layer.L.output.dense.*             <-> layers.L.mlp.fc2.*
    p.encoder.layer.L.output.LayerNorm.*  [ln.*] <-> layers.L.ffn_norm.*
    [p.encoder.ln.*]                             <-> norm.*                  (pre_ln only)
    cls.predictions.transform.dense.*            <-> lm_head.dense.*
    cls.predictions.transform.LayerNorm.*        <-> lm_head.norm.*
    cls.predictions.bias                         <-> lm_head.bias            (padded / cut)
    cls.predictions.decoder.weight               <-> output.weight           (only when untied)
    cls.predictions.decoder.bias                 <-> lm_head.bias            (only when untied)
    p.pooler.dense.*                             <-> pooler.dense.*          (binary head)
    cls.seq_relationship.*                       <-> binary_head.*           (binary head)

``BertModel`` (post-LN) is ``transformer_block_type="post_ln"``; ``MegatronBert``
(pre-LN, as Megatron-LM) is ``"pre_ln"``. The binary head is imported when the
weights hold ``cls.seq_relationship.weight`` (``*ForPreTraining``) and exported
as ``BertForPreTraining`` / ``MegatronBertForPreTraining`` when the model has it
(``BertForMaskedLM`` / ``MegatronBertForMaskedLM`` otherwise). ``hidden_act``
``gelu`` -> ``gelu``, ``gelu_new`` / ``gelu_pytorch_tanh`` -> ``gelu_tanh``;
``type_vocab_size`` <-> ``num_tokentypes``. Old checkpoints' ``LayerNorm.gamma`` /
``.beta`` names are read as ``.weight`` / ``.bias``; buffers (``position_ids``,
``token_type_ids``) and the tied ``cls.predictions.decoder.*`` are ignored. With
untied embeddings Hugging Face's decoder uses its own ``decoder.bias`` (not
``predictions.bias``): that one is imported, and both are written on export.
Options our model does not implement (relative position embeddings, decoders,
cross-attention) are refused with :class:`ConversionError`.

The name tables are shared with :mod:`epochal.formats.hf.esm` through
:class:`EncoderLayout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from epochal.formats.common import ConversionError, check_shapes, normalize_config, resize_rows
from epochal.model.config import ModelConfig

__all__ = [
    "BERT",
    "MEGATRON_BERT",
    "EncoderLayout",
    "bert_config_from_ours",
    "bert_state_from_ours",
    "ours_state_from_bert",
    "encoder_state_from_ours",
    "has_binary_head",
    "ours_config_from_bert",
    "ours_state_from_encoder",
]

_ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


@dataclass(frozen=True)
class EncoderLayout:
    """The Hugging Face names of one encoder family (``None`` = the family has no such tensor).

    Attributes:
        prefix: the base model's prefix (``"bert."``, ``"esm."``).
        embedding_norm: the embeddings' norm (post-LN BERT).
        attention_norm, ffn_norm: per-layer norms, relative to ``encoder.layer.L.``.
        final_norm: the encoder's final norm (pre-LN), relative to ``prefix``.
        head_dense, head_norm: the masked-LM transform's dense layer and norm (full names).
        head_bias: the head's output bias (full name).
        decoder: the decoder weight's full name (stored only when untied).
        decoder_bias: the decoder ``Linear``'s own bias, if it has one (BERT: tied
            to ``head_bias`` with tied embeddings, the bias used otherwise).
        ignored: suffixes of tensors that are dropped on import (buffers, tied copies).
    """

    prefix: str
    embedding_norm: str | None
    attention_norm: str
    ffn_norm: str
    final_norm: str | None
    head_dense: str
    head_norm: str
    head_bias: str
    decoder: str
    decoder_bias: str | None
    ignored: tuple[str, ...]


BERT = EncoderLayout(
    prefix="bert.",
    embedding_norm="embeddings.LayerNorm",
    attention_norm="attention.output.LayerNorm",
    ffn_norm="output.LayerNorm",
    final_norm=None,
    head_dense="cls.predictions.transform.dense",
    head_norm="cls.predictions.transform.LayerNorm",
    head_bias="cls.predictions.bias",
    decoder="cls.predictions.decoder.weight",
    decoder_bias="cls.predictions.decoder.bias",
    ignored=("embeddings.position_ids", "embeddings.token_type_ids"),
)
MEGATRON_BERT = EncoderLayout(
    prefix="bert.",
    embedding_norm=None,
    attention_norm="attention.ln",
    ffn_norm="ln",
    final_norm="encoder.ln",
    head_dense="cls.predictions.transform.dense",
    head_norm="cls.predictions.transform.LayerNorm",
    head_bias="cls.predictions.bias",
    decoder="cls.predictions.decoder.weight",
    decoder_bias="cls.predictions.decoder.bias",
    ignored=("embeddings.position_ids", "embeddings.token_type_ids"),
)

_LAYER_LINEARS = (
    ("attention.wq", "attention.self.query"),
    ("attention.wk", "attention.self.key"),
    ("attention.wv", "attention.self.value"),
    ("attention.wo", "attention.output.dense"),
    ("mlp.fc1", "intermediate.dense"),
    ("mlp.fc2", "output.dense"),
)
#: ours -> resized along the vocabulary on import (padded) and export (cut).
_VOCAB_ROWS = ("tok_embeddings.weight", "lm_head.bias", "output.weight")


def has_binary_head(weights: Mapping[str, torch.Tensor]) -> bool:
    """Whether a Hugging Face BERT state holds the next-sentence head (``*ForPreTraining``)."""
    return "cls.seq_relationship.weight" in weights


def _name_pairs(config: ModelConfig, layout: EncoderLayout) -> list[tuple[str, str]]:
    """``(ours, hf)`` for every tensor of ``BertModel(config)`` (tied ``output`` excluded)."""
    p = layout.prefix
    pairs = [("tok_embeddings.weight", f"{p}embeddings.word_embeddings.weight")]
    if config.position_embedding_type == "learned_absolute":
        pairs.append(("pos_embeddings.weight", f"{p}embeddings.position_embeddings.weight"))
    if config.num_tokentypes > 0:
        pairs.append(("tokentype_embeddings.weight", f"{p}embeddings.token_type_embeddings.weight"))
    modules = []
    if config.transformer_block_type == "post_ln":
        modules.append(("embedding_norm", f"{p}{_need(layout.embedding_norm, 'post_ln')}"))
    for i in range(config.num_layers):
        src = f"{p}encoder.layer.{i}."
        for ours, hf in (
            *_LAYER_LINEARS,
            ("attention_norm", layout.attention_norm),
            ("ffn_norm", layout.ffn_norm),
        ):
            modules.append((f"layers.{i}.{ours}", src + hf))
    if config.transformer_block_type == "pre_ln":
        modules.append(("norm", f"{p}{_need(layout.final_norm, 'pre_ln')}"))
    modules += [("lm_head.dense", layout.head_dense), ("lm_head.norm", layout.head_norm)]
    if config.bert_binary_head:
        modules += [("pooler.dense", f"{p}pooler.dense"), ("binary_head", "cls.seq_relationship")]
    for ours, hf in modules:
        pairs += [(f"{ours}.weight", f"{hf}.weight"), (f"{ours}.bias", f"{hf}.bias")]
    pairs.append(("lm_head.bias", layout.head_bias))
    if not config.tie_embeddings:
        pairs.append(("output.weight", layout.decoder))
        if layout.decoder_bias is not None:
            pairs.append(("lm_head.bias", layout.decoder_bias))
    return pairs


def _need(name: str | None, block: str) -> str:
    if name is None:
        raise ConversionError(f"this Hugging Face architecture has no {block} blocks")
    return name


def _gamma_beta(name: str) -> str:
    """``...LayerNorm.gamma`` / ``.beta`` (old TF-converted files) -> ``.weight`` / ``.bias``."""
    if name.endswith(".gamma"):
        return name[: -len("gamma")] + "weight"
    if name.endswith(".beta"):
        return name[: -len("beta")] + "bias"
    return name


def ours_state_from_encoder(
    hf_state: Mapping[str, torch.Tensor],
    config: ModelConfig,
    layout: EncoderLayout,
    *,
    source: str = "checkpoint",
    dropped: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Convert a Hugging Face encoder state dict to our names (vocabulary padded with zeros).

    Args:
        hf_state: the Hugging Face tensors.
        config: our config (from the same folder's ``config.json``).
        layout: :data:`BERT`, :data:`MEGATRON_BERT` or ``hf_esm.ESM``.
        source: the file named in errors.
        dropped: prefixes of tensors our model does not have and that are left out
            on purpose (ESM's contact head).

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    hf = {_gamma_beta(k): v for k, v in hf_state.items()}
    for name in list(hf):
        if name.endswith(layout.ignored) or name.startswith(dropped):
            del hf[name]
    pairs = _name_pairs(config, layout)
    if config.tie_embeddings:
        hf.pop(layout.decoder, None)
        if layout.decoder_bias is not None:
            hf.pop(layout.decoder_bias, None)
    elif layout.decoder_bias is not None and layout.decoder_bias in hf:
        # the untied decoder adds its own bias; predictions.bias is an unused copy then
        pairs.remove(("lm_head.bias", layout.head_bias))
        hf.pop(layout.head_bias, None)
    elif layout.decoder_bias is not None:
        pairs.remove(("lm_head.bias", layout.decoder_bias))
    out: dict[str, torch.Tensor] = {}
    for ours, name in pairs:
        try:
            tensor = hf.pop(name)
        except KeyError:
            raise ConversionError(f"{source}: missing tensor {name!r}") from None
        out[ours] = resize_rows(tensor, config.padded_vocab_size) if ours in _VOCAB_ROWS else tensor
    if hf:
        raise ConversionError(f"{source}: unexpected tensors {sorted(hf)[:8]}")
    if config.tie_embeddings:
        out["output.weight"] = out["tok_embeddings.weight"]
    check_shapes(out, config, source)
    return out


def encoder_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig, layout: EncoderLayout
) -> dict[str, torch.Tensor]:
    """Convert our state dict to Hugging Face names (vocabulary cut to ``vocab_size``).

    Tied models get no decoder weight (Hugging Face re-ties it on load).
    """
    v = config.vocab_size
    out = {}
    for ours, hf in _name_pairs(config, layout):
        tensor = state[ours]
        out[hf] = tensor[:v].contiguous() if ours in _VOCAB_ROWS else tensor.contiguous()
    return out


# -------------------------------------------------------------------- configs
def ours_config_from_bert(
    hf: Mapping[str, Any],
    *,
    pre_ln: bool,
    binary_head: bool,
    make_vocab_size_divisible_by: int = 128,
) -> ModelConfig:
    """Our :class:`ModelConfig` from a ``bert`` (``pre_ln=False``) or ``megatron-bert`` config dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly.
    """
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS_IN:
        raise ConversionError(
            f"config.json: hidden_act={act!r} is not supported (use one of {sorted(_ACTIVATIONS_IN)})"
        )
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ConversionError(
            f"config.json: position_embedding_type={position!r} is not supported (absolute only)"
        )
    for key in ("is_decoder", "add_cross_attention"):
        if hf.get(key):
            raise ConversionError(f"config.json: {key}=true is not supported (encoders only)")
    config = ModelConfig(
        type="bert",
        vocab_size=int(hf["vocab_size"]),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        hidden_size=int(hf["hidden_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=int(hf["num_attention_heads"]),
        ffn_hidden_size=int(hf["intermediate_size"]),
        max_position_embeddings=int(hf["max_position_embeddings"]),
        position_embedding_type="learned_absolute",
        normalization="LayerNorm",
        norm_epsilon=float(hf.get("layer_norm_eps", 1e-12)),
        activation=_ACTIVATIONS_IN[act],
        add_bias_linear=True,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", True),
        hidden_dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        num_tokentypes=int(hf.get("type_vocab_size", 2)),
        bert_binary_head=binary_head,
        transformer_block_type="pre_ln" if pre_ln else "post_ln",
        pad_token_id=optional_id(hf, "pad_token_id"),
    )
    return normalize_config(config)


def bert_config_from_ours(config: ModelConfig) -> dict[str, Any]:
    """A ``bert`` (post-LN) or ``megatron-bert`` (pre-LN) ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not a BERT, or uses something Hugging Face's
            BERT does not have (RoPE, RMSNorm, grouped-query attention, no biases,
            a custom head size, no token types).
    """
    if config.type != "bert":
        raise ConversionError(
            f"model.type={config.type!r}: BERT export needs a 'bert' model "
            "(GPT exports as gpt2/llama, ESM as esm)"
        )
    problems = []
    if config.position_embedding_type != "learned_absolute":
        problems.append(f"position_embedding_type={config.position_embedding_type!r}")
    if config.normalization != "LayerNorm":
        problems.append(f"normalization={config.normalization!r}")
    if config.num_kv_heads != config.num_attention_heads:
        problems.append("grouped-query attention")
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        problems.append(f"kv_channels={config.kv_channels}")
    if not (config.add_bias_linear and config.qkv_bias):
        problems.append("linear layers without biases")
    if config.num_tokentypes < 1:
        problems.append("num_tokentypes=0 (Hugging Face BERT always has token types)")
    if problems:
        raise ConversionError("Hugging Face BERT cannot represent: " + "; ".join(problems))
    pre_ln = config.transformer_block_type == "pre_ln"
    family = "MegatronBert" if pre_ln else "Bert"
    head = "ForPreTraining" if config.bert_binary_head else "ForMaskedLM"
    hf = {
        "architectures": [family + head],
        "model_type": "megatron-bert" if pre_ln else "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.ffn_size,
        "hidden_act": _ACTIVATIONS_OUT[config.activation],
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.num_tokentypes,
        "initializer_range": config.init_method_std,
        "layer_norm_eps": config.norm_epsilon,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": config.tie_embeddings,
    }
    if config.pad_token_id is not None:  # else Hugging Face's default (0)
        hf["pad_token_id"] = config.pad_token_id
    return hf


def optional_id(hf: Mapping[str, Any], key: str) -> int | None:
    """``config.json``'s token id ``key`` as an int, or ``None`` when absent or null."""
    value = hf.get(key)
    return None if value is None else int(value)


def _layout(config: ModelConfig) -> EncoderLayout:
    return MEGATRON_BERT if config.transformer_block_type == "pre_ln" else BERT


def ours_state_from_bert(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str = "checkpoint"
) -> dict[str, torch.Tensor]:
    """Convert a ``bert`` (post-LN config) or ``megatron-bert`` (pre-LN) state dict to our names.

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    return ours_state_from_encoder(hf_state, config, _layout(config), source=source)


def bert_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Convert our state dict to ``bert`` / ``megatron-bert`` names (by the block type)."""
    bert_config_from_ours(config)  # validates
    return encoder_state_from_ours(state, config, _layout(config))
