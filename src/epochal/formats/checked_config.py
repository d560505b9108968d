"""Validate a checkpoint's configuration fields before a converter reads them.

Every format's configuration (Hugging Face ``config.json``, Megatron-LM ``args``,
``torch_dist`` ``common.pt`` ``args``, NeMo 2 ``model.yaml`` / ``io.json``) is checked
field by field here, against a schema of kinds (:data:`POS_INT`, :data:`PROB`, ...),
before a converter calls ``int()`` or ``float()`` on it: so ``num_attention_heads:
4.7`` is refused rather than read as 4, and a list, a missing field or a zero gives
``config.json: num_attention_heads must be a positive integer, got [4, 4]`` instead of
a ``TypeError`` / ``KeyError`` / ``ZeroDivisionError`` further down.

Cross-checks against the tensors (:func:`check_vocab_rows`, :func:`check_positions`)
run before any tensor is cut, padded or reshaped.

``None`` counts as absent (Hugging Face writes ``null`` for unset options).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from epochal._checks import is_int, is_real
from epochal._env import env_int
from epochal.formats.common import ConversionError

__all__ = [
    "BOOL",
    "HF_SCHEMAS",
    "MAX_POSITIONS",
    "MEGATRON_SCHEMA",
    "NONNEG_FLOAT",
    "NONNEG_INT",
    "POS_FLOAT",
    "POS_INT",
    "PROB",
    "STR",
    "ConfigFieldError",
    "check_fields",
    "check_positions",
    "check_vocab_rows",
    "max_positions",
]


class ConfigFieldError(ConversionError):
    """A configuration field has the wrong type or range, or is missing (names file and field)."""


Kind = tuple[str, Callable[[Any], bool]]


#: a kind is (description for the message, predicate).
POS_INT: Kind = ("a positive integer", lambda v: is_int(v) and v >= 1)
NONNEG_INT: Kind = ("an integer >= 0", lambda v: is_int(v) and v >= 0)
#: an integer, or a float with an integral value (``2.0``; YAML/JSON writers produce these)
POS_INTEGRAL: Kind = (
    "a positive integer",
    lambda v: (is_int(v) and v >= 1) or (is_real(v) and float(v).is_integer() and v >= 1),
)
POS_FLOAT: Kind = ("a finite number > 0", lambda v: is_real(v) and v > 0)
NONNEG_FLOAT: Kind = ("a finite number >= 0", lambda v: is_real(v) and v >= 0)
PROB: Kind = ("a number in [0, 1]", lambda v: is_real(v) and 0 <= v <= 1)
FRACTION: Kind = ("a number in (0, 1]", lambda v: is_real(v) and 0 < v <= 1)
BOOL: Kind = ("true or false", lambda v: isinstance(v, bool))
STR: Kind = ("a string", lambda v: isinstance(v, str))
MAPPING: Kind = ("a mapping", lambda v: isinstance(v, Mapping))
STR_LIST: Kind = (
    "a list of strings",
    lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
)
TOKEN_IDS: Kind = (
    "an integer >= 0 or a list of them",
    lambda v: (
        (is_int(v) and v >= 0) or (isinstance(v, list) and all(is_int(x) and x >= 0 for x in v))
    ),
)

Schema = Mapping[str, tuple[Kind, bool]]  # field -> (kind, required)

_HF_COMMON: dict[str, tuple[Kind, bool]] = {
    "vocab_size": (POS_INT, True),
    "tie_word_embeddings": (BOOL, False),
    "initializer_range": (NONNEG_FLOAT, False),
    "bos_token_id": (TOKEN_IDS, False),
    "eos_token_id": (TOKEN_IDS, False),
    "pad_token_id": (TOKEN_IDS, False),
    "rope_scaling": (MAPPING, False),
    "rope_parameters": (MAPPING, False),
    "model_type": (STR, True),
}
_HF_ENCODER: dict[str, tuple[Kind, bool]] = {
    **_HF_COMMON,
    "hidden_size": (POS_INT, True),
    "num_hidden_layers": (POS_INT, True),
    "num_attention_heads": (POS_INT, True),
    "intermediate_size": (POS_INT, True),
    "max_position_embeddings": (POS_INT, True),
    "layer_norm_eps": (POS_FLOAT, False),
    "hidden_dropout_prob": (PROB, False),
    "attention_probs_dropout_prob": (PROB, False),
    "type_vocab_size": (NONNEG_INT, False),
    "hidden_act": (STR, False),
    "position_embedding_type": (STR, False),
}

#: the fields Llama-shaped decoders (Llama, Qwen2, Qwen3, Mistral) share.
_HF_DECODER: dict[str, tuple[Kind, bool]] = {
    **_HF_COMMON,
    "hidden_size": (POS_INT, True),
    "num_hidden_layers": (POS_INT, True),
    "num_attention_heads": (POS_INT, True),
    "num_key_value_heads": (POS_INT, False),
    "head_dim": (POS_INT, False),
    "intermediate_size": (POS_INT, True),
    "max_position_embeddings": (POS_INT, False),
    "rms_norm_eps": (POS_FLOAT, False),
    "rope_theta": (POS_FLOAT, False),
    "attention_dropout": (PROB, False),
    "hidden_act": (STR, False),
}
#: sliding-window fields (Mistral: ``sliding_window``; Qwen2/3 also the per-layer keys).
_HF_WINDOW: dict[str, tuple[Kind, bool]] = {
    "sliding_window": (POS_INT, False),
    "max_window_layers": (NONNEG_INT, False),
    "layer_types": (STR_LIST, False),
}

#: Hugging Face ``model_type`` -> the ``config.json`` fields its reader uses.
HF_SCHEMAS: dict[str, Schema] = {
    "gpt2": {
        **_HF_COMMON,
        "n_embd": (POS_INT, True),
        "n_layer": (POS_INT, True),
        "n_head": (POS_INT, True),
        "n_positions": (POS_INT, True),
        "n_inner": (POS_INT, False),
        "layer_norm_epsilon": (POS_FLOAT, False),
        "resid_pdrop": (PROB, False),
        "attn_pdrop": (PROB, False),
        "activation_function": (STR, False),
    },
    "llama": {
        **_HF_COMMON,
        "hidden_size": (POS_INT, True),
        "num_hidden_layers": (POS_INT, True),
        "num_attention_heads": (POS_INT, True),
        "num_key_value_heads": (POS_INT, False),
        "head_dim": (POS_INT, False),
        "intermediate_size": (POS_INT, True),
        "max_position_embeddings": (POS_INT, False),
        "rms_norm_eps": (POS_FLOAT, False),
        "rope_theta": (POS_FLOAT, False),
        "attention_dropout": (PROB, False),
        "attention_bias": (BOOL, False),
        "mlp_bias": (BOOL, False),
        "pretraining_tp": (POS_INT, False),
    },
    "qwen2": {**_HF_DECODER, "use_sliding_window": (BOOL, False), **_HF_WINDOW},
    "qwen3": {
        **_HF_DECODER,
        "attention_bias": (BOOL, False),
        "use_sliding_window": (BOOL, False),
        **_HF_WINDOW,
    },
    "mistral": {**_HF_DECODER, **_HF_WINDOW},
    "mixtral": {
        **_HF_DECODER,
        **_HF_WINDOW,
        "num_local_experts": (POS_INT, False),
        "num_experts_per_tok": (POS_INT, False),
    },
    "qwen2_moe": {  # sliding_window: transformers writes 0 when use_sliding_window is false
        **_HF_DECODER,
        "use_sliding_window": (BOOL, False),
        "max_window_layers": (NONNEG_INT, False),
        "layer_types": (STR_LIST, False),
        "num_experts": (POS_INT, False),
        "num_local_experts": (POS_INT, False),  # transformers 5 writes Qwen3-MoE's so
        "num_experts_per_tok": (POS_INT, False),
        "moe_intermediate_size": (POS_INT, True),
        "norm_topk_prob": (BOOL, False),
        "decoder_sparse_step": (POS_INT, False),
    },
    "bert": _HF_ENCODER,
    "megatron-bert": _HF_ENCODER,
    "esm": {**_HF_ENCODER, "token_dropout": (BOOL, False), "rope_theta": (POS_FLOAT, False)},
    "t5": {
        **_HF_COMMON,
        "d_model": (POS_INT, True),
        "d_kv": (POS_INT, True),
        "d_ff": (POS_INT, True),
        "num_layers": (POS_INT, True),
        "num_decoder_layers": (POS_INT, False),
        "num_heads": (POS_INT, True),
        "n_positions": (POS_INT, False),
        "relative_attention_num_buckets": (POS_INT, False),
        "relative_attention_max_distance": (POS_INT, False),
        "layer_norm_epsilon": (POS_FLOAT, False),
        "dropout_rate": (PROB, False),
        "feed_forward_proj": (STR, False),
    },
}
HF_SCHEMAS["mt5"] = HF_SCHEMAS["t5"]
HF_SCHEMAS["qwen3_moe"] = {**HF_SCHEMAS["qwen2_moe"], "attention_bias": (BOOL, False)}
HF_SCHEMAS["glm4_moe"] = {
    **_HF_DECODER,
    "attention_bias": (BOOL, False),
    "use_qk_norm": (BOOL, False),
    "n_routed_experts": (POS_INT, True),
    "num_experts_per_tok": (POS_INT, False),
    "moe_intermediate_size": (POS_INT, True),
    "n_shared_experts": (NONNEG_INT, False),
    "first_k_dense_replace": (NONNEG_INT, False),
    "n_group": (POS_INT, False),
    "topk_group": (POS_INT, False),
    "routed_scaling_factor": (POS_FLOAT, False),
    "norm_topk_prob": (BOOL, False),
}
#: fields inside ``rope_scaling`` / ``rope_parameters`` (Llama, ESM).
HF_ROPE_SCHEMA: Schema = {
    "rope_type": (STR, False),
    "type": (STR, False),
    "factor": (POS_FLOAT, False),
    "low_freq_factor": (POS_FLOAT, False),
    "high_freq_factor": (POS_FLOAT, False),
    "original_max_position_embeddings": (POS_INT, False),
    "rope_theta": (POS_FLOAT, False),
    "partial_rotary_factor": (FRACTION, False),
}

#: Megatron-LM ``args`` and NeMo 2 / Megatron-Core ``TransformerConfig`` fields (same names).
MEGATRON_SCHEMA: Schema = {
    "num_layers": (POS_INT, False),
    "hidden_size": (POS_INT, False),
    "num_attention_heads": (POS_INT, False),
    "num_query_groups": (POS_INT, False),
    "kv_channels": (POS_INT, False),
    "ffn_hidden_size": (POS_INT, False),
    "max_position_embeddings": (POS_INT, False),
    "seq_length": (POS_INT, False),
    "vocab_size": (POS_INT, False),
    "padded_vocab_size": (POS_INT, False),
    "make_vocab_size_divisible_by": (POS_INT, False),
    "tensor_model_parallel_size": (POS_INT, False),
    "pipeline_model_parallel_size": (POS_INT, False),
    "model_parallel_size": (POS_INT, False),
    "norm_epsilon": (POS_FLOAT, False),
    "layernorm_epsilon": (POS_FLOAT, False),
    "rotary_base": (POS_FLOAT, False),
    "rotary_percent": (FRACTION, False),
    "rope_scaling_factor": (POS_FLOAT, False),
    "rotary_seq_len_interpolation_factor": (POS_INTEGRAL, False),
    "hidden_dropout": (PROB, False),
    "attention_dropout": (PROB, False),
    "init_method_std": (NONNEG_FLOAT, False),
    "normalization": (STR, False),
    "position_embedding_type": (STR, False),
    "activation_func": (STR, False),
    **{
        flag: (BOOL, False)
        for flag in (
            "swiglu",
            "openai_gelu",
            "add_bias_linear",
            "add_qkv_bias",
            "group_query_attention",
            "untie_embeddings_and_output_weights",
            "share_embeddings_and_output_weights",
            "rotary_interleaved",
            "apply_layernorm_1p",
            "gated_linear_unit",
            "bias_activation_fusion",
            "bias_gelu_fusion",
            "use_rotary_position_embeddings",
            "use_rope_scaling",
            "bert_binary_head",
            "add_binary_head",
            "token_dropout",
        )
    },
    "mask_token_id": (NONNEG_INT, False),
    "pad_token_id": (NONNEG_INT, False),
    # mixture of experts (None = dense / the default)
    "num_experts": (POS_INT, False),
    "moe_router_topk": (POS_INT, False),
    "moe_ffn_hidden_size": (POS_INT, False),
    "moe_shared_expert_intermediate_size": (POS_INT, False),
    "expert_model_parallel_size": (POS_INT, False),
    "expert_tensor_parallel_size": (POS_INT, False),
    "moe_aux_loss_coeff": (NONNEG_FLOAT, False),
    "moe_z_loss_coeff": (NONNEG_FLOAT, False),
    **{
        flag: (BOOL, False)
        for flag in ("moe_shared_expert_gate", "moe_router_pre_softmax", "moe_grouped_gemm")
    },
}


def check_fields(
    fields: Mapping[str, Any], schema: Schema, source: str, *, prefix: str = ""
) -> None:
    """Check every field of ``schema`` present in ``fields`` (and that required ones are).

    Args:
        fields: the configuration as read (``None`` values count as absent).
        schema: field -> (kind, required).
        source: the file named in the message (``config.json``'s path, ...).
        prefix: prepended to field names in the message (``"args."``, ``"rope_scaling."``).

    Raises:
        ConfigFieldError: ``{source}: {prefix}{field} must be {kind}, got {value!r}``, or
            ``... is missing``.
    """
    for name, ((what, ok), required) in schema.items():
        value = fields.get(name)
        if value is None:
            if required:
                raise ConfigFieldError(f"{source}: {prefix}{name} is missing (must be {what})")
            continue
        if not ok(value):
            raise ConfigFieldError(f"{source}: {prefix}{name} must be {what}, got {_show(value)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


#: default upper bound on ``max_position_embeddings`` (``EPOCHAL_MAX_POSITIONS`` overrides).
MAX_POSITIONS = 1 << 24


def max_positions() -> int:
    """The largest position count a checkpoint may declare: ``$EPOCHAL_MAX_POSITIONS`` or 2**24.

    Raises:
        ConfigFieldError: the variable is set but not an integer from 1 to ``sys.maxsize``
            (the message names it and the range).
    """
    return env_int(
        "EPOCHAL_MAX_POSITIONS",
        MAX_POSITIONS,
        minimum=1,
        maximum=sys.maxsize,
        unit="positions",
        error=ConfigFieldError,
    )


def check_positions(value: Any, source: str, field: str) -> None:
    """Refuse a position count beyond :func:`max_positions` before a model allocates tables of it.

    Raises:
        ConfigFieldError: naming ``source``, ``field`` and the limit.
    """
    limit = max_positions()
    if is_int(value) and value > limit:
        raise ConfigFieldError(
            f"{source}: {field}={value} is over the limit of {limit} positions "
            "(set EPOCHAL_MAX_POSITIONS to raise it)"
        )


def check_vocab_rows(
    source: str,
    field: str,
    vocab: int,
    rows: int,
    tensor: str,
    *,
    max_padding: int = 0,
) -> None:
    """Refuse a vocabulary size that contradicts the embedding's row count.

    Args:
        source, field: the configuration file and field (``config.json``, ``vocab_size``).
        vocab: the configured vocabulary.
        rows: the embedding's rows.
        tensor: the embedding's name, for the message.
        max_padding: rows the format may add beyond ``vocab`` (Megatron's padding to a
            multiple); 0: the two must be equal.

    Raises:
        ConfigFieldError: ``vocab`` > ``rows`` (zero rows would be appended) or more than
            ``max_padding`` rows beyond it (trained rows would be cut), naming both.
    """
    if vocab <= rows <= vocab + max_padding:
        return
    allowed = f"equal {rows}" if max_padding == 0 else f"be in [{rows - max_padding}, {rows}]"
    raise ConfigFieldError(
        f"{source}: {field}={vocab} contradicts {tensor} with {rows} rows (it must "
        f"{allowed}); refusing to cut or pad the embedding"
    )
