"""``ModelConfig``: the hyper-parameters of a model (GPT decoder, BERT/ESM encoder, T5), Megatron-LM's names.

Field names follow Megatron-LM's ``TransformerConfig`` / command-line arguments
where one exists (``num_query_groups``, ``kv_channels``, ``ffn_hidden_size``,
``make_vocab_size_divisible_by``, ``untie_embeddings_and_output_weights``, ...), so
that a Megatron ``args`` namespace maps onto it field by field.

Every invalid value raises :class:`ConfigError` (a ``ValueError``) whose message
starts with the option name and states the allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from epochal.model.head_options import HEAD_FIELDS, HEADS, LORA_TARGETS, validate_head

__all__ = [
    "ConfigError",
    "ModelConfig",
    "POSITION_EMBEDDING_TYPES",
    "NORMALIZATIONS",
    "ACTIVATIONS",
    "ROPE_SCALING_TYPES",
    "MODEL_TYPES",
    "TRANSFORMER_BLOCK_TYPES",
    "ENCODER_FIELDS",
    "HEAD_FIELDS",
    "HEADS",
    "LORA_TARGETS",
    "T5_FIELDS",
]

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


@dataclass(kw_only=True)
class ModelConfig:
    """Hyper-parameters of a model built by :func:`epochal.model.build_model`.

    ``type`` picks the model: ``"gpt"`` (:class:`epochal.model.GPTModel`, a pre-norm
    causal decoder; the default, and what a config without ``type`` means),
    ``"bert"`` (:class:`epochal.model.BertModel`, Megatron's / Hugging Face's BERT
    encoder), ``"esm"`` (the same encoder configured as ESM-2: rotary positions,
    pre-LN, no token types, ``token_dropout``) or ``"t5"``
    (:class:`epochal.model.T5Model`, an encoder-decoder: Megatron's T5 with learned
    absolute positions, or Hugging Face's T5 v1.0 / v1.1 / mT5 with the relative
    attention bias).

    Attributes:
        type: ``"gpt"``, ``"bert"``, ``"esm"`` or ``"t5"`` (see above).
        vocab_size: number of token ids the tokenizer produces (>= 1).
        make_vocab_size_divisible_by: the embedding and output tables have
            :attr:`padded_vocab_size` rows, ``vocab_size`` rounded up to a
            multiple of this (>= 1; Megatron's default 128). Unlike Megatron the
            padding does NOT depend on the tensor-parallel size, so checkpoints
            reshard freely; the parallel layer checks that TP divides it.
        hidden_size: model width ``h`` (>= 1).
        num_layers: number of transformer blocks (>= 1).
        num_attention_heads: number of query heads (>= 1).
        num_query_groups: number of key/value heads. ``None`` = multi-head
            attention (one per query head); ``1`` = multi-query attention;
            otherwise grouped-query attention. Must divide ``num_attention_heads``.
        kv_channels: per-head dimension (``head_dim``). ``None`` =
            ``hidden_size // num_attention_heads`` (which must then divide).
        ffn_hidden_size: MLP inner width. ``None`` = ``4 * hidden_size`` for
            GELU, and Megatron's ``int(4 * hidden_size * 2 / 3 / 64) * 64`` for SwiGLU
            (at least 64).
        max_position_embeddings: the longest sequence the model accepts, in
            tokens (size of the learned position table and of the RoPE cache).
        position_embedding_type: ``"learned_absolute"`` (GPT-2), ``"rope"``
            (rotary, Llama), ``"alibi"`` (BLOOM/MPT linear biases), ``"none"``,
            or (T5 only) ``"relative"``: T5's learned relative attention bias
            (log-spaced distance buckets, bidirectional in the encoder,
            one-directional in the decoder; Megatron-Core's name).
        rotary_base: RoPE base frequency (``theta``), > 0.
        rotary_percent: fraction of each head's dimensions that is rotated, in
            (0, 1]; the rotated part must have an even size.
        rope_scaling_type: RoPE frequency scaling for long contexts (see
            :mod:`epochal.model.layers.positions`): ``None`` (plain RoPE), ``"linear"``
            (positions divided by ``rope_scaling_factor``; Hugging Face
            ``"linear"``, Megatron's ``--rotary-seq-len-interpolation-factor``)
            or ``"llama3"`` (Llama 3.1's smooth per-frequency scaling; Megatron-Core's
            ``--use-rope-scaling``). Needs ``position_embedding_type="rope"``.
        rope_scaling_factor: the context extension factor, > 0 (Llama 3.1: 8).
            Ignored without ``rope_scaling_type``.
        rope_low_freq_factor: ``"llama3"`` only: wavelengths longer than
            ``rope_original_max_position_embeddings / rope_low_freq_factor``
            tokens are divided by the factor; > 0 (Llama 3.1: 1).
        rope_high_freq_factor: ``"llama3"`` only: wavelengths shorter than
            ``rope_original_max_position_embeddings / rope_high_freq_factor``
            tokens are kept; > ``rope_low_freq_factor`` (Llama 3.1: 4).
        rope_original_max_position_embeddings: ``"llama3"`` only: the
            pre-training context length in tokens, >= 1 (Llama 3.1: 8192).
        normalization: ``"LayerNorm"`` or ``"RMSNorm"``.
        norm_epsilon: epsilon of the norms (> 0).
        activation: ``"gelu"`` (exact, erf), ``"gelu_tanh"`` (the tanh
            approximation GPT-2 uses; Megatron's ``--openai-gelu``),
            ``"swiglu"`` (gated SiLU, Llama), and for T5 only ``"relu"`` (T5
            v1.0) or ``"gated_gelu"`` (gated GELU with the tanh approximation:
            Hugging Face T5 v1.1 / mT5 ``"gated-gelu"``; same ``w1``/``w3``/``w2``
            layout as SwiGLU).
        add_bias_linear: biases on every linear layer except the output head.
        add_qkv_bias: biases on the q/k/v projections. ``None`` = follow
            ``add_bias_linear`` (Megatron's ``--add-qkv-bias`` sets it alone).
        untie_embeddings_and_output_weights: ``False`` (default, GPT-2) shares
            the input embedding matrix with the output head.
        hidden_dropout: dropout probability after the embeddings and after the
            attention and MLP outputs, in [0, 1).
        attention_dropout: dropout probability on attention weights, in [0, 1).
        init_method_std: standard deviation of the normal initialization (> 0);
            output projections use ``init_method_std / sqrt(2 * num_layers)``.
        num_tokentypes: encoders: size of the token-type (segment) embedding
            table, >= 0 (Megatron's name; BERT uses 2, ESM and GPT 0 = no table).
        bert_binary_head: BERT only: add the pooler (dense + tanh on the first
            token) and the binary (next-sentence / random-next) head
            ``Linear(hidden, 2)`` (Megatron's ``--bert-binary-head``).
        transformer_block_type: encoders: ``"pre_ln"`` (Megatron-LM's BERT,
            Hugging Face ``MegatronBert``, ESM-2: norm before attention/MLP, a final
            norm) or ``"post_ln"`` (original BERT, Hugging Face ``BertModel``:
            norm after each residual sum, a norm on the embeddings, no final
            norm). NeMo's name for the same choice. GPT is always ``"pre_ln"``.
        token_dropout: ESM only: Hugging Face ``EsmForMaskedLM``'s embedding
            rescaling (the embeddings of ``mask_token_id`` are zeroed and the rest
            scaled by ``(1 - 0.15 * 0.8) / (1 - observed mask fraction)``, in
            training and evaluation alike). Needs ``mask_token_id``.
        mask_token_id: ESM: the id of the mask token (ESM-2's alphabet: 32);
            ``None`` = unknown (then ``token_dropout`` must be off).
        pad_token_id: encoders: the padding token's id (metadata: the model
            masks padding by ``padding_mask``, not by id; Hugging Face ESM needs
            it, ESM-2's alphabet: 1). ``None`` = unknown.
        head: encoders: ``"mlm"`` (the masked-LM head) or a fine-tuning head
            (:mod:`epochal.model.heads`): ``"sequence_regression"`` /
            ``"sequence_classification"`` (mean of the last hidden states over the
            residues, then BioNeMo's MLP ``hidden -> head_hidden_size -> num_labels``)
            or ``"residue_classification"`` (per token, ``residue_head``).
        num_labels: fine-tuning heads: regression targets or classes (>= 1; >= 2 to classify).
        head_hidden_size: the head's hidden width; ``None`` = BioNeMo's (256 for the
            sequence MLP, 32 channels for the residue convolution).
        head_dropout: the head's dropout in [0, 1) (BioNeMo: 0.25).
        residue_head: ``"conv"`` (BioNeMo's ``MegatronConvNetHead``: two 7-wide
            convolutions along the sequence) or ``"linear"``.
        freeze_encoder: fine-tuning heads: only the head (and LoRA adapters) train.
        lora_rank: LoRA adapters of this rank on ``lora_target_modules`` (0 = none;
            the encoder is then frozen: only adapters and head train).
        lora_alpha / lora_dropout: the adapters' scale ``alpha / rank`` and input dropout.
        lora_target_modules: comma-separated projections of every block
            (``wq``, ``wk``, ``wv``, ``wo``, ``fc1``, ``fc2``).
        encoder_num_layers: T5: encoder blocks (>= 1); ``None`` = ``num_layers``
            (Megatron's ``--encoder-num-layers``).
        decoder_num_layers: T5: decoder blocks (>= 1); ``None`` = ``num_layers``
            (Megatron's ``--decoder-num-layers``).
        relative_attention_num_buckets: T5 with ``"relative"`` positions: number
            of distance buckets (>= 4, even; T5: 32).
        relative_attention_max_distance: T5 with ``"relative"`` positions:
            distances at or beyond this share the last bucket (>= 1; T5: 128).
        softmax_scale: T5: the attention's query-key scale; ``None`` =
            ``1 / sqrt(head_dim)`` (Megatron); Hugging Face T5 uses ``1.0``
            (the scale is folded into its initialization). Megatron-Core's name.
        output_bias: T5: a bias on the output head ``[padded_vocab]``
            (Megatron's ``T5LMHead`` has one when the head is tied to the embeddings).
        scale_decoder_output: T5: multiply the decoder's final hidden states by
            ``hidden_size ** -0.5`` before the output head (Hugging Face T5 does
            this when ``tie_word_embeddings`` is true).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    make_vocab_size_divisible_by: int = 128
    num_query_groups: int | None = None
    kv_channels: int | None = None
    ffn_hidden_size: int | None = None
    position_embedding_type: Literal["learned_absolute", "rope", "alibi", "none", "relative"] = (
        "learned_absolute"
    )
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    rope_scaling_type: Literal["linear", "llama3"] | None = None
    rope_scaling_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    norm_epsilon: float = 1e-5
    activation: Literal["gelu", "gelu_tanh", "swiglu", "relu", "gated_gelu"] = "gelu"
    add_bias_linear: bool = True
    add_qkv_bias: bool | None = None
    untie_embeddings_and_output_weights: bool = False
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    type: Literal["gpt", "bert", "esm", "t5"] = "gpt"
    num_tokentypes: int = 0
    bert_binary_head: bool = False
    transformer_block_type: Literal["pre_ln", "post_ln"] = "pre_ln"
    token_dropout: bool = False
    mask_token_id: int | None = None
    pad_token_id: int | None = None
    head: Literal[
        "mlm", "sequence_regression", "sequence_classification", "residue_classification"
    ] = "mlm"
    num_labels: int = 1
    head_hidden_size: int | None = None
    head_dropout: float = 0.25
    residue_head: Literal["conv", "linear"] = "conv"
    freeze_encoder: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: str = "wq,wv"
    encoder_num_layers: int | None = None
    decoder_num_layers: int | None = None
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    softmax_scale: float | None = None
    output_bias: bool = False
    scale_decoder_output: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation
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
        for name in ("add_bias_linear", "untie_embeddings_and_output_weights"):
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
        self._validate_model_type()

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
            for f in dataclasses.fields(self):
                if f.name in ENCODER_FIELDS and f.name != "type":
                    _require(
                        getattr(self, f.name) == f.default,
                        f.name,
                        f"is an encoder option (model.type 'bert' or 'esm'); a GPT config "
                        f"must leave it at {f.default!r}, got {getattr(self, f.name)!r}",
                    )
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
    @property
    def padded_vocab_size(self) -> int:
        """``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by``."""
        m = self.make_vocab_size_divisible_by
        return int(math.ceil(self.vocab_size / m) * m)

    @property
    def head_dim(self) -> int:
        """Per-head dimension: ``kv_channels`` or ``hidden_size // num_attention_heads``."""
        if self.kv_channels is not None:
            return self.kv_channels
        return self.hidden_size // self.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        """Number of key/value heads (``num_query_groups`` or ``num_attention_heads``)."""
        return (
            self.num_query_groups if self.num_query_groups is not None else self.num_attention_heads
        )

    @property
    def ffn_size(self) -> int:
        """Effective MLP inner width (resolves the ``ffn_hidden_size=None`` default)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        if self.activation == "swiglu":
            return max(64, int((4 * self.hidden_size * 2 / 3) / 64) * 64)
        return 4 * self.hidden_size

    @property
    def rotary_dim(self) -> int:
        """Number of rotated channels per head (``int(head_dim * rotary_percent)``)."""
        return int(self.head_dim * self.rotary_percent)

    @property
    def qkv_bias(self) -> bool:
        """Whether the q/k/v projections have biases."""
        return self.add_bias_linear if self.add_qkv_bias is None else self.add_qkv_bias

    @property
    def tie_embeddings(self) -> bool:
        """``not untie_embeddings_and_output_weights`` (False with a fine-tuning head: no output layer)."""
        return not self.untie_embeddings_and_output_weights and self.head == "mlm"

    @property
    def lora_targets(self) -> tuple[str, ...]:
        """``lora_target_modules`` split at commas (stripped, empty parts dropped)."""
        return tuple(t.strip() for t in str(self.lora_target_modules).split(",") if t.strip())

    # ------------------------------------------------------------------- helpers
    @property
    def is_encoder(self) -> bool:
        """True for the bidirectional encoder-only types (``"bert"``, ``"esm"``)."""
        return self.type in ("bert", "esm")

    @property
    def num_encoder_layers(self) -> int:
        """T5: ``encoder_num_layers`` or ``num_layers``."""
        return self.num_layers if self.encoder_num_layers is None else self.encoder_num_layers

    @property
    def num_decoder_layers(self) -> int:
        """T5: ``decoder_num_layers`` or ``num_layers``."""
        return self.num_layers if self.decoder_num_layers is None else self.decoder_num_layers

    @property
    def num_blocks(self) -> int:
        """Number of transformer blocks: ``num_layers``, or encoder + decoder blocks for T5."""
        if self.type == "t5":
            return self.num_encoder_layers + self.num_decoder_layers
        return self.num_layers

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (TOML/JSON friendly; ``None`` values kept).

        A GPT config omits ``type`` and the encoder-only fields (:data:`ENCODER_FIELDS`,
        all at their defaults), exactly as configs were written before encoders
        existed; every type but T5 omits the T5 fields (:data:`T5_FIELDS`); :meth:`from_dict` reads such a dict back as ``type="gpt"``.
        """
        values = dataclasses.asdict(self)
        if self.type == "gpt":
            for name in ENCODER_FIELDS:
                del values[name]
        if self.type != "t5":
            for name in T5_FIELDS:
                del values[name]
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a dict, rejecting unknown keys with a :class:`ConfigError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            _require(key in known, str(key), f"unknown model option; known: {sorted(known)}")
        return cls(**values)


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
