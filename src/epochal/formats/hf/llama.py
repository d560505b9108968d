"""Hugging Face ``LlamaForCausalLM`` <-> epochal ``GPTModel``.

Mapping (``L`` = layer index)::

    model.embed_tokens.weight                 <-> tok_embeddings.weight   (rows padded / cut)
    model.layers.L.input_layernorm.weight     <-> layers.L.attention_norm.weight
    model.layers.L.self_attn.q_proj.*         <-> layers.L.attention.wq.*
    model.layers.L.self_attn.k_proj.*         <-> layers.L.attention.wk.*
    model.layers.L.self_attn.v_proj.*         <-> layers.L.attention.wv.*
    model.layers.L.self_attn.o_proj.*         <-> layers.L.attention.wo.*
    model.layers.L.post_attention_layernorm.* <-> layers.L.ffn_norm.weight
    model.layers.L.mlp.gate_proj.*            <-> layers.L.mlp.w1.*
    model.layers.L.mlp.up_proj.*              <-> layers.L.mlp.w3.*
    model.layers.L.mlp.down_proj.*            <-> layers.L.mlp.w2.*
    model.norm.weight                         <-> norm.weight
    lm_head.weight                            <-> output.weight (absent when tied)

Rotary layout: Hugging Face Llama checkpoints store q/k rows in the
"rotate_half" layout (channel ``i`` paired with ``i + head_dim/2``; the HF
conversion script from Meta's weights already applied the interleaved ->
half-split row permutation), which is also epochal's (and Megatron-Core's
default) convention, so q/k rows are copied unchanged. Meta's original
``consolidated.*.pth`` weights (interleaved pairs) are not read here; convert
them to Hugging Face format first.

Configuration: ``rope_parameters.rope_theta`` (transformers 5) or
``rope_theta`` (4.x) -> ``rotary_base``. RoPE scaling, read from
``rope_scaling`` (4.x; ``rope_type`` or the older ``type``) or
``rope_parameters`` (5.x), maps onto our ``rope_scaling_*`` fields::

    rope_type "linear" | "llama3"          <-> rope_scaling_type
    factor                                 <-> rope_scaling_factor
    low_freq_factor, high_freq_factor      <-> rope_low_freq_factor, rope_high_freq_factor  (llama3)
    original_max_position_embeddings       <-> rope_original_max_position_embeddings        (llama3)

(Llama 3.1-3.3 use ``llama3`` with factor 8, 1, 4, 8192.) Export writes both
spellings (``rope_scaling`` only when scaled) so transformers 4.x and 5.x read
it back. Other RoPE types (``dynamic``, ``yarn``, ``longrope``, ...) raise
:class:`ConversionError` naming the type. ``head_dim`` -> ``kv_channels``;
``num_key_value_heads`` -> ``num_query_groups``; ``attention_bias`` must equal
``mlp_bias`` (our ``add_bias_linear`` covers ``o_proj`` and the MLP together).
Llama has no hidden dropout: imported models get ``hidden_dropout=0``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from epochal.formats.common import (
    ConversionError,
    attach_output_head,
    check_shapes,
    normalize_config,
    resize_rows,
)
from epochal.model.config import ModelConfig

__all__ = [
    "decoder_config",
    "decoder_export_problems",
    "decoder_json",
    "decoder_state_from_ours",
    "decoder_state_to_ours",
    "llama_config_from_ours",
    "llama_state_from_ours",
    "ours_config_from_llama",
    "ours_state_from_llama",
]

_LAYER_MAP = {
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "mlp.w1",
    "mlp.up_proj": "mlp.w3",
    "mlp.down_proj": "mlp.w2",
    # QK-norm (Qwen3): present only in families that have it
    "self_attn.q_norm": "attention.q_layernorm",
    "self_attn.k_norm": "attention.k_layernorm",
}
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


# Hugging Face rope_type -> the config.json keys it needs, each with our ModelConfig field.
_SCALING_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "linear": (("factor", "rope_scaling_factor"),),
    "llama3": (
        ("factor", "rope_scaling_factor"),
        ("low_freq_factor", "rope_low_freq_factor"),
        ("high_freq_factor", "rope_high_freq_factor"),
        ("original_max_position_embeddings", "rope_original_max_position_embeddings"),
    ),
}


def _rope_type(params: Mapping[str, Any]) -> str:
    kind = params.get("rope_type", params.get("type"))
    return "default" if kind is None else kind


def _rope_fields(
    hf: Mapping[str, Any], family: str = "Llama", *, partial_rotary: bool = False
) -> dict[str, Any]:
    """``rotary_base``, ``rotary_percent`` and the ``rope_scaling_*`` fields of our config
    from a Llama ``config.json`` (``partial_rotary``: the family rotates part of each head,
    ``partial_rotary_factor``; GLM-4.5).

    ``rope_scaling`` (4.x) takes precedence over ``rope_parameters`` (5.x) as in
    transformers 5; if both name a scaling type they must agree.

    Raises:
        ConversionError: a RoPE type other than default / linear / llama3, a
            missing scaling key, disagreeing ``rope_scaling`` and
            ``rope_parameters``, or ``partial_rotary_factor != 1`` without ``partial_rotary``.
    """
    params = hf.get("rope_parameters") or {}
    legacy = hf.get("rope_scaling") or {}
    source = legacy or params
    rope_type = _rope_type(source)
    if legacy and params and _rope_type(params) != "default":
        mine = {**legacy, "rope_type": rope_type}
        theirs = {**params, "rope_type": _rope_type(params)}
        for key in ("rope_type", "factor", "low_freq_factor", "high_freq_factor"):
            a, b = mine.get(key), theirs.get(key)
            if a is not None and b is not None and a != b:
                raise ConversionError(
                    f"config.json: rope_scaling and rope_parameters disagree on {key!r} "
                    f"({a!r} vs {b!r})"
                )
    if rope_type != "default" and rope_type not in _SCALING_KEYS:
        raise ConversionError(
            f"config.json: rope_type={rope_type!r} (RoPE scaling) is not supported; "
            f"only the default RoPE, {' and '.join(map(repr, _SCALING_KEYS))}"
        )
    partial = source.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1.0) and not partial_rotary:
        raise ConversionError(
            f"config.json: partial_rotary_factor={partial!r} is not supported for {family} "
            "(only 1: RoPE over the whole head)"
        )
    theta = source.get("rope_theta", hf.get("rope_theta", params.get("rope_theta", 10000.0)))
    fields: dict[str, Any] = {"rotary_base": float(theta), "rotary_percent": float(partial or 1.0)}
    if rope_type in _SCALING_KEYS:
        fields["rope_scaling_type"] = rope_type
        for key, ours in _SCALING_KEYS[rope_type]:
            if source.get(key) is None:
                raise ConversionError(f"config.json: rope_type={rope_type!r} needs {key!r}")
            value = source[key]
            fields[ours] = int(value) if key == "original_max_position_embeddings" else float(value)
    return fields


def _rope_json(config: ModelConfig) -> dict[str, Any]:
    """RoPE keys of an exported ``config.json``.

    ``rope_theta`` and (when scaled) ``rope_scaling`` for transformers 4.x,
    ``rope_parameters`` for 5.x; the two always agree.
    """
    kind = config.rope_scaling_type
    scaling: dict[str, Any] = {}
    if kind is not None:
        scaling = {"rope_type": kind}
        for key, ours in _SCALING_KEYS[kind]:
            scaling[key] = getattr(config, ours)
    out: dict[str, Any] = {"rope_theta": config.rotary_base}
    if scaling:
        out["rope_scaling"] = scaling
    out["rope_parameters"] = {"rope_type": "default", **scaling, "rope_theta": config.rotary_base}
    if config.rotary_percent != 1.0:  # (only families that hold it export it: GLM-4.5)
        out["rope_parameters"]["partial_rotary_factor"] = config.rotary_percent
    return out


def decoder_config(
    hf: Mapping[str, Any],
    *,
    family: str,
    add_bias_linear: bool,
    add_qkv_bias: bool | None,
    qk_layernorm: bool = False,
    sliding_window: int | None = None,
    default_head_dim: int | None = None,
    make_vocab_size_divisible_by: int = 128,
    moe: Mapping[str, Any] | None = None,
    partial_rotary: bool = False,
) -> ModelConfig:
    """Our :class:`ModelConfig` from the ``config.json`` of a Llama-shaped decoder.

    The fields Llama, Qwen2, Qwen3 and Mistral share (sizes, GQA, ``head_dim``,
    RoPE and its scaling, RMSNorm epsilon, tying, dropout); the family's own
    options (biases, QK-norm, sliding window) come as arguments.

    Args:
        family: the family's name, for messages.
        default_head_dim: ``head_dim`` when ``config.json`` has none (Qwen3: 128);
            ``None`` = ``hidden_size // num_attention_heads``.
        moe: the mixture-of-experts fields of our config (:mod:`epochal.formats.hf.moe`).
        partial_rotary: the family may rotate part of each head (``partial_rotary_factor``).

    Raises:
        ConversionError: ``hidden_act`` other than ``silu``, ``pretraining_tp != 1``,
            or an unsupported RoPE option (named).
    """
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConversionError(
            f"config.json: hidden_act={act!r} is not supported ({family}'s SwiGLU needs 'silu')"
        )
    if int(hf.get("pretraining_tp", 1) or 1) != 1:
        raise ConversionError("config.json: pretraining_tp != 1 is not supported")
    hidden = int(hf["hidden_size"])
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or default_head_dim or hidden // heads)
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    config = ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        hidden_size=hidden,
        num_layers=int(hf["num_hidden_layers"]),
        num_attention_heads=heads,
        num_query_groups=None if kv_heads == heads else kv_heads,
        kv_channels=None if head_dim * heads == hidden else head_dim,
        ffn_hidden_size=int(hf["intermediate_size"]),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        position_embedding_type="rope",
        **_rope_fields(hf, family, partial_rotary=partial_rotary),
        normalization="RMSNorm",
        norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        add_bias_linear=add_bias_linear,
        add_qkv_bias=add_qkv_bias,
        qk_layernorm=qk_layernorm,
        sliding_window=sliding_window,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", False),
        hidden_dropout=0.0,
        attention_dropout=float(hf.get("attention_dropout", 0.0) or 0.0),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        **(moe or {}),
    )
    return normalize_config(config)


def ours_config_from_llama(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Build our :class:`ModelConfig` from a Llama ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly.
    """
    attention_bias = bool(hf.get("attention_bias", False))
    mlp_bias = bool(hf.get("mlp_bias", False))
    if attention_bias != mlp_bias:
        raise ConversionError(
            f"config.json: attention_bias={attention_bias} with mlp_bias={mlp_bias} is not supported "
            "(epochal's add_bias_linear covers o_proj and the MLP together)"
        )
    return decoder_config(
        hf,
        family="Llama",
        add_bias_linear=mlp_bias,
        add_qkv_bias=None,  # equal to add_bias_linear (checked above)
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
    )


def decoder_export_problems(
    config: ModelConfig, *, moe: bool = False, partial_rotary: bool = False
) -> list[str]:
    """What keeps ``config`` from being any Llama-shaped decoder (RoPE, RMSNorm, SwiGLU).

    ``moe``: the target family has mixture-of-experts layers (else experts are a problem);
    ``partial_rotary``: it may rotate part of each head (else ``rotary_percent < 1`` is).
    """
    problems = []
    if config.num_experts is not None and not moe:
        problems.append(
            f"num_experts={config.num_experts} (a mixture of experts; this family is dense)"
        )
    if config.type != "gpt":
        problems.append(f"model.type={config.type!r} (needs a GPT decoder)")
    if config.position_embedding_type != "rope" or (
        config.rotary_percent != 1.0 and not partial_rotary
    ):
        problems.append(
            f"position_embedding_type={config.position_embedding_type!r}, rotary_percent="
            f"{config.rotary_percent} (needs rope over the whole head)"
        )
    if config.normalization != "RMSNorm":
        problems.append(f"normalization={config.normalization!r} (needs RMSNorm)")
    if config.activation != "swiglu":
        problems.append(f"activation={config.activation!r} (needs swiglu)")
    return problems


def decoder_json(
    config: ModelConfig, *, architecture: str, model_type: str, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """The ``config.json`` keys Llama-shaped decoders share (no validation: the caller's)."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.norm_epsilon,
        **_rope_json(config),
        "attention_dropout": config.attention_dropout,
        "initializer_range": config.init_method_std,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": None,
        "eos_token_id": None,
        "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def llama_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A Llama ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` uses something Llama does not have.
    """
    problems = decoder_export_problems(config)
    if config.qkv_bias != config.add_bias_linear:
        problems.append(
            f"add_qkv_bias={config.qkv_bias} differs from add_bias_linear={config.add_bias_linear} "
            "(Llama's attention_bias covers q, k, v and o together)"
        )
    if config.qk_layernorm:
        problems.append("qk_layernorm=True (Llama has no QK-norm)")
    if config.sliding_window is not None:
        problems.append(
            f"sliding_window={config.sliding_window} (Llama attends to every earlier token)"
        )
    if problems:
        raise ConversionError("cannot export to Llama: " + "; ".join(problems))
    return {
        **decoder_json(config, architecture="LlamaForCausalLM", model_type="llama", dtype=dtype),
        "attention_bias": config.qkv_bias,
        "mlp_bias": config.add_bias_linear,
        "pretraining_tp": 1,
    }


def ours_state_from_llama(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str = "Llama checkpoint"
) -> dict[str, torch.Tensor]:
    """Convert a Llama state dict to our parameter names (vocabulary padded with zeros).

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    return decoder_state_to_ours(hf_state, config, source=source)


def decoder_state_to_ours(
    hf_state: Mapping[str, torch.Tensor],
    config: ModelConfig,
    *,
    source: str,
    moe_module: Callable[[str], str | None] | None = None,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """A Llama-shaped decoder's state dict (Llama, Qwen2, Qwen3, Mistral) in our names.

    The vocabulary is padded with zeros; the tensors must be exactly those of
    ``build_model(config)`` (a bias or QK-norm the config lacks is unexpected).
    ``moe_module`` names a layer's mixture-of-experts modules in ours (None for
    the others; :mod:`epochal.formats.hf.moe`); ``extra``: tensors the family renamed
    itself, already in our names (checked with the others).

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    out: dict[str, torch.Tensor] = {}
    head = None
    for name, tensor in hf_state.items():
        if name.endswith(_IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight":
            head = tensor
            continue
        if not name.startswith("model."):
            raise ConversionError(f"{source}: unexpected tensor {name!r}")
        rest = name[len("model.") :]
        if rest == "embed_tokens.weight":
            out["tok_embeddings.weight"] = resize_rows(tensor, config.padded_vocab_size)
        elif rest == "norm.weight":
            out["norm.weight"] = tensor
        elif rest.startswith("layers."):
            _, idx, tail = rest.split(".", 2)
            module, _, kind = tail.rpartition(".")
            ours = _LAYER_MAP.get(module) or (moe_module(module) if moe_module else None)
            if ours is None:
                raise ConversionError(f"{source}: unexpected tensor {name!r}")
            out[f"layers.{idx}.{ours}.{kind}"] = tensor
        else:
            raise ConversionError(f"{source}: unexpected tensor {name!r}")
    out = attach_output_head(config, out, head, source=source, head_name="lm_head.weight")
    out.update(extra or {})
    check_shapes(out, config, source)
    return out


def llama_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Convert our state dict to Llama names (vocabulary cut to ``vocab_size``; no ``lm_head`` when tied)."""
    llama_config_from_ours(config)  # validates
    return decoder_state_from_ours(state, config)


def decoder_state_from_ours(
    state: Mapping[str, torch.Tensor],
    config: ModelConfig,
    moe_module: Callable[[str], str | None] | None = None,
) -> dict[str, torch.Tensor]:
    """Our state dict in Llama-shaped names (no validation: the family's exporter checks first).

    ``moe_module`` names our mixture-of-experts modules in the family's layout.
    """
    inverse = {v: k for k, v in _LAYER_MAP.items()}
    v = config.vocab_size
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": state["tok_embeddings.weight"][:v].contiguous()
    }
    for name, tensor in state.items():
        if not name.startswith("layers."):
            continue
        _, idx, tail = name.split(".", 2)
        module, _, kind = tail.rpartition(".")
        theirs = inverse.get(module) or (moe_module(module) if moe_module else None)
        out[f"model.layers.{idx}.{theirs}.{kind}"] = tensor
    out["model.norm.weight"] = state["norm.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["output.weight"][:v].contiguous()
    return out
