"""The validation rules of :class:`~epochal.model.config.ModelConfig`, its option names and error.

Every invalid value raises :class:`ConfigError` (a ``ValueError``) whose message
starts with the option name and states the allowed range. :class:`ModelConfigChecks`
holds the checks as methods; :class:`~epochal.model.config.ModelConfig` inherits them
and runs :meth:`~ModelConfigChecks.validate` after construction.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from epochal.model.head_options import CLASSIFIER_HEADS, HEAD_FIELDS, validate_head
from epochal.model.moe_options import validate_moe

POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "alibi", "none", "relative")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "relu", "gated_gelu")
ROPE_SCALING_TYPES = ("linear", "llama3")
MODEL_TYPES = ("gpt", "bert", "esm", "t5")
TRANSFORMER_BLOCK_TYPES = ("pre_ln", "post_ln")
#: Fields that only encoders use; a GPT config leaves them at their defaults, and
#: :meth:`ModelConfig.to_dict` omits them (with ``type``) for GPT, so GPT configs
#: serialize exactly as before the encoder types existed.
ENCODER_FIELDS = (
    "type",
    "num_tokentypes",
    "bert_binary_head",
    "transformer_block_type",
    "token_dropout",
    "mask_token_id",
    "pad_token_id",
    *HEAD_FIELDS,
)
#: Fields only T5 uses; other types leave them at their defaults, and
#: :meth:`ModelConfig.to_dict` omits them for every type but ``"t5"``.
T5_FIELDS = (
    "encoder_num_layers",
    "decoder_num_layers",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
    "softmax_scale",
    "output_bias",
    "scale_decoder_output",
)


class ConfigError(ValueError):
    """An invalid configuration value.

    Attributes:
        option: the dotted name of the offending option (e.g. ``"hidden_size"``
            or, once a config tree re-raises it, ``"model.hidden_size"``).
    """

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        self.detail = message
        super().__init__(f"{option}: {message}")

    def with_prefix(self, prefix: str) -> ConfigError:
        """Return the same error with ``prefix.`` prepended to the option name."""
        return ConfigError(f"{prefix}.{self.option}", self.detail)


def _require(cond: bool, option: str, message: str) -> None:
    if not cond:
        raise ConfigError(option, message)


class ModelConfigChecks:
    """The checks of :class:`~epochal.model.config.ModelConfig` (a mixin: no fields of its own)."""

    def validate(self) -> None:
        """Check every field; raise :class:`ConfigError` naming the first bad one."""
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_attention_heads",
            "max_position_embeddings",
            "make_vocab_size_divisible_by",
        ):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                name,
                f"must be an integer >= 1, got {value!r}",
            )
        heads = self.num_attention_heads
        if self.num_query_groups is not None:
            g = self.num_query_groups
            _require(
                isinstance(g, int)
                and not isinstance(g, bool)
                and 1 <= g <= heads
                and heads % g == 0,
                "num_query_groups",
                f"must be an integer in [1, num_attention_heads={heads}] that divides it "
                f"(or None for multi-head attention), got {g!r}",
            )
        if self.kv_channels is None:
            _require(
                self.hidden_size % heads == 0,
                "num_attention_heads",
                f"must divide hidden_size={self.hidden_size} when kv_channels is not set, "
                f"got {heads}",
            )
        else:
            _require(
                isinstance(self.kv_channels, int) and self.kv_channels >= 1,
                "kv_channels",
                f"must be an integer >= 1 or None, got {self.kv_channels!r}",
            )
        if self.ffn_hidden_size is not None:
            _require(
                isinstance(self.ffn_hidden_size, int) and self.ffn_hidden_size >= 1,
                "ffn_hidden_size",
                f"must be an integer >= 1 or None, got {self.ffn_hidden_size!r}",
            )
        _require(
            self.position_embedding_type in POSITION_EMBEDDING_TYPES,
            "position_embedding_type",
            f"must be one of {POSITION_EMBEDDING_TYPES}, got {self.position_embedding_type!r}",
        )
        _require(
            self.normalization in NORMALIZATIONS,
            "normalization",
            f"must be one of {NORMALIZATIONS}, got {self.normalization!r}",
        )
        _require(
            self.activation in ACTIVATIONS,
            "activation",
            f"must be one of {ACTIVATIONS}, got {self.activation!r}",
        )
        _require(
            _is_real(self.rotary_base) and self.rotary_base > 0,
            "rotary_base",
            f"must be > 0, got {self.rotary_base!r}",
        )
        _require(
            _is_real(self.rotary_percent) and 0 < self.rotary_percent <= 1,
            "rotary_percent",
            f"must be in (0, 1], got {self.rotary_percent!r}",
        )
        if self.position_embedding_type == "rope":
            _require(
                self.rotary_dim >= 2 and self.rotary_dim % 2 == 0,
                "rotary_percent",
                f"must rotate an even number >= 2 of the head_dim={self.head_dim} channels, "
                f"got {self.rotary_percent!r} (-> {self.rotary_dim})",
            )
        self._validate_rope_scaling()
        _require(
            _is_real(self.norm_epsilon) and self.norm_epsilon > 0,
            "norm_epsilon",
            f"must be > 0, got {self.norm_epsilon!r}",
        )
        for name in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, name)
            _require(_is_real(value) and 0 <= value < 1, name, f"must be in [0, 1), got {value!r}")
        _require(
            _is_real(self.init_method_std) and self.init_method_std > 0,
            "init_method_std",
            f"must be > 0, got {self.init_method_std!r}",
        )
        for name in (
            "add_bias_linear",
            "untie_embeddings_and_output_weights",
            "padded_vocab_in_softmax",
        ):
            _require(
                isinstance(getattr(self, name), bool),
                name,
                f"must be true or false, got {getattr(self, name)!r}",
            )
        _require(
            self.add_qkv_bias is None or isinstance(self.add_qkv_bias, bool),
            "add_qkv_bias",
            f"must be true, false or None, got {self.add_qkv_bias!r}",
        )
        self._validate_attention_variants()
        self._validate_model_type()
        validate_moe(self, _require)

    def _validate_attention_variants(self) -> None:
        _require(
            isinstance(self.qk_layernorm, bool),
            "qk_layernorm",
            f"must be true or false, got {self.qk_layernorm!r}",
        )
        w = self.sliding_window
        _require(
            w is None or (isinstance(w, int) and not isinstance(w, bool) and w >= 1),
            "sliding_window",
            f"must be None (full causal attention) or an integer >= 1 (tokens), got {w!r}",
        )
        for name, default in (("qk_layernorm", False), ("sliding_window", None)):
            _require(
                self.type == "gpt" or getattr(self, name) == default,
                name,
                f"is a GPT option (model.type='gpt'); model.type={self.type!r} must leave it "
                f"at {default!r}, got {getattr(self, name)!r}",
            )

    def _validate_model_type(self) -> None:
        _require(
            self.type in MODEL_TYPES,
            "type",
            f"must be one of {MODEL_TYPES}, got {self.type!r}",
        )
        _require(
            isinstance(self.num_tokentypes, int)
            and not isinstance(self.num_tokentypes, bool)
            and self.num_tokentypes >= 0,
            "num_tokentypes",
            f"must be an integer >= 0, got {self.num_tokentypes!r}",
        )
        for name in ("bert_binary_head", "token_dropout"):
            _require(
                isinstance(getattr(self, name), bool),
                name,
                f"must be true or false, got {getattr(self, name)!r}",
            )
        _require(
            self.transformer_block_type in TRANSFORMER_BLOCK_TYPES,
            "transformer_block_type",
            f"must be one of {TRANSFORMER_BLOCK_TYPES}, got {self.transformer_block_type!r}",
        )
        for name in ("mask_token_id", "pad_token_id"):
            m = getattr(self, name)
            _require(
                m is None
                or (isinstance(m, int) and not isinstance(m, bool) and 0 <= m < self.vocab_size),
                name,
                f"must be None or an integer in [0, vocab_size={self.vocab_size}), got {m!r}",
            )
        if self.type == "t5":
            self._validate_t5()
            return
        for f in dataclasses.fields(self):
            if f.name in T5_FIELDS:
                _require(
                    getattr(self, f.name) == f.default,
                    f.name,
                    f"is a T5 option (model.type 't5'); model.type={self.type!r} must leave "
                    f"it at {f.default!r}, got {getattr(self, f.name)!r}",
                )
        _require(
            self.position_embedding_type != "relative",
            "position_embedding_type",
            f"'relative' (T5's relative attention bias) needs model.type='t5', "
            f"got model.type={self.type!r}",
        )
        _require(
            self.activation not in ("relu", "gated_gelu"),
            "activation",
            f"{self.activation!r} is a T5 activation (model.type='t5'), "
            f"got model.type={self.type!r}",
        )
        if self.type == "gpt":
            classifier = self.head in CLASSIFIER_HEADS
            for f in dataclasses.fields(self):
                if classifier and f.name in HEAD_FIELDS:
                    continue
                if f.name in ENCODER_FIELDS and f.name != "type":
                    _require(
                        getattr(self, f.name) == f.default,
                        f.name,
                        f"is an encoder option: set model.type='bert' or 'esm' (this config's "
                        f"is 'gpt'), or leave it at {f.default!r}; got {getattr(self, f.name)!r}",
                    )
            if classifier:
                validate_head(self, _require)
            return
        _require(
            self.position_embedding_type in ("learned_absolute", "rope"),
            "position_embedding_type",
            f"must be 'learned_absolute' or 'rope' for model.type={self.type!r}, "
            f"got {self.position_embedding_type!r}",
        )
        _require(
            self.activation in ("gelu", "gelu_tanh"),
            "activation",
            f"must be 'gelu' or 'gelu_tanh' for model.type={self.type!r} (the masked-LM head "
            f"uses it), got {self.activation!r}",
        )
        validate_head(self, _require)
        if self.type == "bert":
            _require(
                not self.token_dropout,
                "token_dropout",
                "is an ESM option; model.type='bert' must leave it false",
            )
            return
        # esm
        _require(
            self.num_tokentypes == 0,
            "num_tokentypes",
            f"must be 0 for model.type='esm' (no token types), got {self.num_tokentypes!r}",
        )
        _require(
            not self.bert_binary_head,
            "bert_binary_head",
            "must be false for model.type='esm' (no binary head)",
        )
        _require(
            self.transformer_block_type == "pre_ln",
            "transformer_block_type",
            f"must be 'pre_ln' for model.type='esm', got {self.transformer_block_type!r}",
        )
        _require(
            not self.token_dropout or self.mask_token_id is not None,
            "mask_token_id",
            "must be set when token_dropout is true (the token whose embedding is dropped)",
        )

    def _validate_t5(self) -> None:
        _require(
            self.position_embedding_type in ("learned_absolute", "relative"),
            "position_embedding_type",
            f"must be 'learned_absolute' or 'relative' for model.type='t5', "
            f"got {self.position_embedding_type!r}",
        )
        _require(
            self.activation in ("gelu", "gelu_tanh", "relu", "gated_gelu"),
            "activation",
            f"must be 'gelu', 'gelu_tanh', 'relu' or 'gated_gelu' for model.type='t5', "
            f"got {self.activation!r}",
        )
        for name, default in (
            ("num_tokentypes", 0),
            ("bert_binary_head", False),
            ("token_dropout", False),
            ("transformer_block_type", "pre_ln"),
        ):
            _require(
                getattr(self, name) == default,
                name,
                f"must be {default!r} for model.type='t5', got {getattr(self, name)!r}",
            )
        for name in ("encoder_num_layers", "decoder_num_layers"):
            n = getattr(self, name)
            _require(
                n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 1),
                name,
                f"must be None (= num_layers) or an integer >= 1, got {n!r}",
            )
        buckets = self.relative_attention_num_buckets
        _require(
            isinstance(buckets, int)
            and not isinstance(buckets, bool)
            and buckets >= 4
            and buckets % 2 == 0,
            "relative_attention_num_buckets",
            f"must be an even integer >= 4, got {buckets!r}",
        )
        distance = self.relative_attention_max_distance
        _require(
            isinstance(distance, int) and not isinstance(distance, bool) and distance >= 1,
            "relative_attention_max_distance",
            f"must be an integer >= 1, got {distance!r}",
        )
        _require(
            self.softmax_scale is None or (_is_real(self.softmax_scale) and self.softmax_scale > 0),
            "softmax_scale",
            f"must be None (= 1/sqrt(head_dim)) or > 0, got {self.softmax_scale!r}",
        )
        for name in ("output_bias", "scale_decoder_output"):
            _require(
                isinstance(getattr(self, name), bool),
                name,
                f"must be true or false, got {getattr(self, name)!r}",
            )

    def _validate_rope_scaling(self) -> None:
        _require(
            self.rope_scaling_type is None or self.rope_scaling_type in ROPE_SCALING_TYPES,
            "rope_scaling_type",
            f"must be one of {ROPE_SCALING_TYPES} or None, got {self.rope_scaling_type!r}",
        )
        _require(
            self.rope_scaling_type is None or self.position_embedding_type == "rope",
            "rope_scaling_type",
            f"needs position_embedding_type='rope', got {self.position_embedding_type!r}",
        )
        for name in ("rope_scaling_factor", "rope_low_freq_factor"):
            value = getattr(self, name)
            _require(_is_real(value) and value > 0, name, f"must be > 0, got {value!r}")
        high, low = self.rope_high_freq_factor, self.rope_low_freq_factor
        _require(
            _is_real(high) and high > low,
            "rope_high_freq_factor",
            f"must be > rope_low_freq_factor={low!r}, got {high!r}",
        )
        original = self.rope_original_max_position_embeddings
        _require(
            isinstance(original, int) and not isinstance(original, bool) and original >= 1,
            "rope_original_max_position_embeddings",
            f"must be an integer >= 1, got {original!r}",
        )

    # --------------------------------------------------------------- derived sizes


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
