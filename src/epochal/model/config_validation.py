"""The rules between :class:`~epochal.model.config.ModelConfig`'s fields, its option names and error.

Each field's own type and range come from its annotation and :func:`~epochal._checks.checked`
metadata (:func:`~epochal._checks.check_fields`); the rules that relate fields (a size that
must divide another, options of one model type only) are written out here.
:class:`ModelConfigChecks` holds them as methods; :class:`~epochal.model.config.ModelConfig`
inherits them and runs :meth:`~ModelConfigChecks.validate` after construction. Every invalid
value raises :class:`ConfigError` (a ``ValueError``) whose message starts with the option name
and states the allowed range.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from epochal._checks import ConfigError, check_fields, is_int, is_real, require
from epochal.model.head_options import CLASSIFIER_HEADS, HEAD_FIELDS, validate_head
from epochal.model.moe_options import validate_moe

__all__ = [
    "ACTIVATIONS",
    "ENCODER_FIELDS",
    "MODEL_TYPES",
    "NORMALIZATIONS",
    "POSITION_EMBEDDING_TYPES",
    "ROPE_SCALING_TYPES",
    "T5_FIELDS",
    "TRANSFORMER_BLOCK_TYPES",
    "ConfigError",
    "ModelConfigChecks",
]

PositionEmbeddingType = Literal["learned_absolute", "rope", "alibi", "none", "relative"]
Normalization = Literal["LayerNorm", "RMSNorm"]
Activation = Literal["gelu", "gelu_tanh", "swiglu", "relu", "gated_gelu"]
RopeScalingType = Literal["linear", "llama3"]
ModelType = Literal["gpt", "bert", "esm", "t5"]
TransformerBlockType = Literal["pre_ln", "post_ln"]

POSITION_EMBEDDING_TYPES: tuple[str, ...] = typing.get_args(PositionEmbeddingType)
NORMALIZATIONS: tuple[str, ...] = typing.get_args(Normalization)
ACTIVATIONS: tuple[str, ...] = typing.get_args(Activation)
ROPE_SCALING_TYPES: tuple[str, ...] = typing.get_args(RopeScalingType)
MODEL_TYPES: tuple[str, ...] = typing.get_args(ModelType)
TRANSFORMER_BLOCK_TYPES: tuple[str, ...] = typing.get_args(TransformerBlockType)
#: Fields that only encoders use; a GPT config leaves them at their defaults, and
#: :meth:`ModelConfig.to_dict` omits them (with ``type``) for GPT, so a GPT config's
#: dict holds only the fields GPT models read.
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


class ModelConfigChecks:
    """The rules of :class:`~epochal.model.config.ModelConfig` (a mixin: no fields of its own)."""

    def validate(self) -> None:
        """Check each field's type and range, then the rules between fields.

        The fields of the ``"t5"``, ``"head"`` and ``"moe"`` groups are checked only for the
        configurations that use them (model.type ``"t5"``; an encoder or a classifier head;
        ``num_experts`` set); elsewhere they must stay at their defaults.

        Raises:
            ConfigError: naming the first bad field.
        """
        check_fields(self)
        heads = self.num_attention_heads
        g = self.num_query_groups
        require(
            g is None or (is_int(g) and 1 <= g <= heads and heads % g == 0),
            "num_query_groups",
            f"must be an integer in [1, num_attention_heads={heads}] that divides it "
            f"(or None for multi-head attention), got {g!r}",
        )
        require(
            self.kv_channels is not None or self.hidden_size % heads == 0,
            "num_attention_heads",
            f"must divide hidden_size={self.hidden_size} when kv_channels is not set, got {heads}",
        )
        if self.position_embedding_type == "rope":
            require(
                self.rotary_dim >= 2 and self.rotary_dim % 2 == 0,
                "rotary_percent",
                f"must rotate an even number >= 2 of the head_dim={self.head_dim} channels, "
                f"got {self.rotary_percent!r} (-> {self.rotary_dim})",
            )
        require(
            self.rope_scaling_type is None or self.position_embedding_type == "rope",
            "rope_scaling_type",
            f"needs position_embedding_type='rope', got {self.position_embedding_type!r}",
        )
        high, low = self.rope_high_freq_factor, self.rope_low_freq_factor
        require(
            is_real(high) and high > low,
            "rope_high_freq_factor",
            f"must be > rope_low_freq_factor={low!r}, got {high!r}",
        )
        for name, default in (("qk_layernorm", False), ("sliding_window", None)):
            require(
                self.type == "gpt" or getattr(self, name) == default,
                name,
                f"is a GPT option (model.type='gpt'); model.type={self.type!r} must leave it "
                f"at {default!r}, got {getattr(self, name)!r}",
            )
        self._validate_model_type()
        validate_moe(self)

    def _validate_model_type(self) -> None:
        for name in ("mask_token_id", "pad_token_id"):
            m = getattr(self, name)
            require(
                m is None or (is_int(m) and 0 <= m < self.vocab_size),
                name,
                f"must be None or an integer in [0, vocab_size={self.vocab_size}), got {m!r}",
            )
        if self.type == "t5":
            self._validate_t5()
            return
        self._require_defaults(
            T5_FIELDS,
            "is a T5 option (model.type 't5'); model.type={type!r} "
            "must leave it at {default!r}, got {value!r}",
        )
        require(
            self.position_embedding_type != "relative",
            "position_embedding_type",
            f"'relative' (T5's relative attention bias) needs model.type='t5', "
            f"got model.type={self.type!r}",
        )
        require(
            self.activation not in ("relu", "gated_gelu"),
            "activation",
            f"{self.activation!r} is a T5 activation (model.type='t5'), "
            f"got model.type={self.type!r}",
        )
        if self.type == "gpt":
            classifier = self.head in CLASSIFIER_HEADS
            encoder_only = [
                name
                for name in ENCODER_FIELDS
                if name != "type" and not (classifier and name in HEAD_FIELDS)
            ]
            self._require_defaults(
                encoder_only,
                "is an encoder option: set model.type='bert' or 'esm' (this config's is 'gpt'), "
                "or leave it at {default!r}; got {value!r}",
            )
            if classifier:
                validate_head(self)
            return
        require(
            self.position_embedding_type in ("learned_absolute", "rope"),
            "position_embedding_type",
            f"must be 'learned_absolute' or 'rope' for model.type={self.type!r}, "
            f"got {self.position_embedding_type!r}",
        )
        require(
            self.activation in ("gelu", "gelu_tanh"),
            "activation",
            f"must be 'gelu' or 'gelu_tanh' for model.type={self.type!r} (the masked-LM head "
            f"uses it), got {self.activation!r}",
        )
        validate_head(self)
        if self.type == "bert":
            require(
                not self.token_dropout,
                "token_dropout",
                "is an ESM option; model.type='bert' must leave it false",
            )
            return
        # esm
        require(
            self.num_tokentypes == 0,
            "num_tokentypes",
            f"must be 0 for model.type='esm' (no token types), got {self.num_tokentypes!r}",
        )
        require(
            not self.bert_binary_head,
            "bert_binary_head",
            "must be false for model.type='esm' (no binary head)",
        )
        require(
            self.transformer_block_type == "pre_ln",
            "transformer_block_type",
            f"must be 'pre_ln' for model.type='esm', got {self.transformer_block_type!r}",
        )
        require(
            not self.token_dropout or self.mask_token_id is not None,
            "mask_token_id",
            "must be set when token_dropout is true (the token whose embedding is dropped)",
        )

    def _require_defaults(self, names: typing.Iterable[str], message: str) -> None:
        """Each of ``names`` at its default; ``message`` formats ``type``, ``default`` and ``value``."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in names:
            value = getattr(self, name)
            require(
                value == defaults[name],
                name,
                message.format(type=self.type, default=defaults[name], value=value),
            )

    def _validate_t5(self) -> None:
        require(
            self.position_embedding_type in ("learned_absolute", "relative"),
            "position_embedding_type",
            f"must be 'learned_absolute' or 'relative' for model.type='t5', "
            f"got {self.position_embedding_type!r}",
        )
        require(
            self.activation in ("gelu", "gelu_tanh", "relu", "gated_gelu"),
            "activation",
            f"must be 'gelu', 'gelu_tanh', 'relu' or 'gated_gelu' for model.type='t5', "
            f"got {self.activation!r}",
        )
        self._require_defaults(
            ("num_tokentypes", "bert_binary_head", "token_dropout", "transformer_block_type"),
            "must be {default!r} for model.type='t5', got {value!r}",
        )
        check_fields(self, "t5")
