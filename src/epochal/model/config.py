"""``ModelConfig``: the hyper-parameters of a model (GPT decoder, BERT/ESM encoder, T5), Megatron-LM's names.

Field names follow Megatron-LM's ``TransformerConfig`` / command-line arguments
where one exists (``num_query_groups``, ``kv_channels``, ``ffn_hidden_size``,
``make_vocab_size_divisible_by``, ``untie_embeddings_and_output_weights``, ...), so
that a Megatron ``args`` namespace maps onto it field by field.

Every invalid value raises :class:`ConfigError` (a ``ValueError``) whose message
starts with the option name and states the allowed range: each field's type and range
come from its annotation and :func:`~epochal._checks.checked` metadata, the rules between
fields from :mod:`epochal.model.config_validation`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from epochal._checks import checked, require
from epochal.model.config_validation import (
    ACTIVATIONS,
    ENCODER_FIELDS,
    MODEL_TYPES,
    NORMALIZATIONS,
    POSITION_EMBEDDING_TYPES,
    ROPE_SCALING_TYPES,
    T5_FIELDS,
    TRANSFORMER_BLOCK_TYPES,
    Activation,
    ConfigError,
    ModelConfigChecks,
    ModelType,
    Normalization,
    PositionEmbeddingType,
    RopeScalingType,
    TransformerBlockType,
)
from epochal.model.head_options import (
    HEAD_FIELDS,
    HEADS,
    LORA_TARGETS,
    Head,
    HeadTransform,
    ResidueHead,
)
from epochal.model.moe_options import MOE_FIELDS, BalanceLoss, RouterScore

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
    "MOE_FIELDS",
]


#: options whose ``None`` stands for a value derived from others -> the property giving it
_DERIVED_OPTIONS = {
    "ffn_hidden_size": "ffn_size",
    "moe_ffn_hidden_size": "moe_ffn_size",
    "kv_channels": "head_dim",
    "num_query_groups": "num_kv_heads",
    "add_qkv_bias": "qkv_bias",
}


@dataclass(kw_only=True)
class ModelConfig(ModelConfigChecks):
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
        padded_vocab_in_softmax: whether the padded ids (``vocab_size`` up to
            :attr:`padded_vocab_size`) join the softmax of the loss and the top-1
            accuracy. ``True`` (the default, for pretraining from scratch): they do, as in
            Megatron-Core's cross-entropy, which sees every row of the padded output
            layer; the model learns to give them low logits and the losses are
            Megatron-Core's. ``False``: only the ``vocab_size`` real ids, which is
            transformers' loss (its logits have exactly ``vocab_size`` columns). Every
            model read from a Hugging Face folder (``checkpoint.init_from``,
            ``epochal convert``) gets ``False``, so it trains and reports transformers'
            loss. Every loss path follows it (the plain, chunked and compiled
            cross-entropy, the vocabulary-parallel one, the pipeline's last stage,
            evaluation); a custom loss function receives all the padded columns.
            Generation never produces a padded id either way.
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
            ``add_bias_linear`` (Megatron's ``--add-qkv-bias`` sets it alone;
            Qwen2 / Qwen2.5: ``add_qkv_bias=True`` with ``add_bias_linear=False``).
        qk_layernorm: GPT only: normalize each head's query and key over its
            ``head_dim`` channels before the rotary embedding, with the norm
            ``normalization`` names (weights ``attention.q_layernorm.weight`` /
            ``attention.k_layernorm.weight`` of ``[head_dim]``, shared by every head;
            epsilon ``norm_epsilon``). Megatron-Core's ``--qk-layernorm``; Qwen3's
            ``q_norm`` / ``k_norm``.
        sliding_window: GPT only: sliding-window causal attention: each query
            attends to itself and the ``sliding_window - 1`` tokens before it
            (Hugging Face Mistral's / Qwen2's ``sliding_window``; Megatron-Core's
            ``window_size=(sliding_window - 1, 0)``), in every layer. ``None``
            (default) = full causal attention. >= 1; a sequence no longer than the
            window attends exactly as without one.
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
            or ``"residue_classification"`` (per token, ``residue_head``); or, for
            encoders and GPT models, a Hugging Face classifier head
            (:class:`~epochal.model.heads.ClassifierHead`): ``"pooled_classifier"`` (one
            position per sequence, ``*ForSequenceClassification``) or ``"token_classifier"``
            (every position, ``*ForTokenClassification``).
        num_labels: fine-tuning heads: regression targets or classes (>= 1; >= 2 to classify).
        head_hidden_size: the head's hidden width; ``None`` = BioNeMo's (256 for the
            sequence MLP, 32 channels for the residue convolution).
        head_dropout: the head's dropout in [0, 1) (BioNeMo: 0.25).
        residue_head: ``"conv"`` (BioNeMo's ``MegatronConvNetHead``: two 7-wide
            convolutions along the sequence) or ``"linear"``.
        head_transform: classifier heads: ``"none"`` (dropout, then the classifier
            ``Linear(hidden, num_labels)``), ``"pooler"`` (BERT's ``tanh(dense)``, dropout,
            classifier) or ``"dense_tanh"`` (ESM's: dropout, ``tanh(dense)``, dropout, classifier).
        head_bias: classifier heads: the classifier has a bias (GPT-2 / Llama's ``score``: none).
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
        num_experts: GPT only: ``None`` (default) = dense MLPs; otherwise the MoE
            blocks (``moe_layer_freq``) replace their MLP by a router and this many
            experts (:mod:`epochal.model.layers.moe`). Megatron's ``--num-experts``.
        moe_router_topk: experts per token, in [1, num_experts] (``--moe-router-topk``; 2).
        moe_ffn_hidden_size: each expert's inner width; ``None`` = ``ffn_hidden_size``'s
            (``--moe-ffn-hidden-size``; Hugging Face's ``moe_intermediate_size``).
        moe_shared_expert_intermediate_size: the inner width of a shared expert every
            token goes through besides its routed ones; ``None`` = no shared expert
            (``--moe-shared-expert-intermediate-size``; Qwen2-MoE's
            ``shared_expert_intermediate_size``).
        moe_shared_expert_gate: multiply the shared expert's output by
            ``sigmoid(shared_expert_gate(x))`` (a ``[1, hidden]`` weight; Qwen2-MoE;
            ``--moe-shared-expert-gate``).
        moe_router_pre_softmax: ``False`` (default): the top-k probabilities are
            renormalised to sum to 1 (Mixtral, Qwen3-MoE, Qwen2-MoE's
            ``norm_topk_prob=True``); ``True``: the softmax over all experts is kept
            as it is (Qwen2-MoE's ``norm_topk_prob=False``; ``--moe-router-pre-softmax``).
        moe_aux_loss_coeff: weight of the load-balancing loss (Switch Transformer's,
            Megatron's normalisation: 1.0 when perfectly balanced) of every MoE block,
            >= 0 (``--moe-aux-loss-coeff``; 0 = off).
        moe_z_loss_coeff: weight of the router z-loss ``mean(logsumexp(logits)^2)``
            (ST-MoE), >= 0 (``--moe-z-loss-coeff``; 0 = off).
        moe_expert_capacity_factor: ``None`` (default) = dropless; a number > 0 caps
            each expert at ``ceil(tokens * topk / num_experts * factor)`` assignments
            per micro-batch, the lowest-probability ones dropped
            (``--moe-expert-capacity-factor``, Megatron's ``"probs"`` drop policy).
        moe_layer_freq: ``k``: blocks ``0, k, 2k, ...`` are MoE blocks (default 1:
            all); or a list of 0/1 per block (``--moe-layer-freq``; DeepSeek's
            ``first_k_dense_replace = n`` is ``[0] * n + [1] * (num_layers - n)``).
        moe_router_score_function: ``"softmax"`` (default) or ``"sigmoid"`` (DeepSeek-V3:
            each expert's score ``sigmoid(logit)``, the top-k scores renormalised when
            ``moe_router_topk > 1``; ``--moe-router-score-function``).
        moe_router_enable_expert_bias: DeepSeek-V3's auxiliary-loss-free balancing: a
            per-expert bias added to the scores for choosing the top-k only (not to the
            weights), moved after every step by ``moe_router_bias_update_rate`` towards
            balance (:func:`epochal.model.layers.moe.update_expert_bias`); sigmoid scores
            only (``--moe-router-enable-expert-bias``).
        moe_router_bias_update_rate: the bias's step, > 0 (``--moe-router-bias-update-rate``;
            1e-3, Megatron-Core's default).
        moe_router_num_groups, moe_router_group_topk: group-limited routing: the experts
            in ``num_groups`` equal groups, each token choosing among the experts of its
            ``group_topk`` best groups (a group's score: the sum of its top
            ``moe_router_topk / group_topk`` scores; DeepSeek-V3's ``n_group`` /
            ``topk_group``; ``--moe-router-num-groups`` / ``--moe-router-group-topk``).
        moe_router_topk_scaling_factor: the routed experts' weights multiplied by it
            (DeepSeek-V3's ``routed_scaling_factor``; ``--moe-router-topk-scaling-factor``);
            ``None`` = 1.
        moe_router_load_balancing_type: what ``moe_aux_loss_coeff`` weighs:
            ``"aux_loss"`` (default: the switch loss over the micro-batch's tokens),
            ``"seq_aux_loss"`` (DeepSeek-V3's sequence-wise loss: each sequence's switch
            loss, averaged over the sequences) or ``"none"`` (recorded, not trained on;
            ``--moe-router-load-balancing-type``).
        moe_grouped_gemm: run each MoE layer's experts as one grouped GEMM per projection
            over the tokens sorted by expert (:mod:`epochal.model.layers.grouped_experts`;
            the same forward bits as one expert at a time, gradients within rounding);
            one process or data parallelism, no linear biases (``--moe-grouped-gemm``).
    """

    vocab_size: int = checked(ge=1)
    hidden_size: int = checked(ge=1)
    num_layers: int = checked(ge=1)
    num_attention_heads: int = checked(ge=1)
    max_position_embeddings: int = checked(ge=1)
    make_vocab_size_divisible_by: int = checked(128, ge=1)
    padded_vocab_in_softmax: bool = checked(True)
    num_query_groups: int | None = None
    kv_channels: int | None = checked(None, ge=1)
    ffn_hidden_size: int | None = checked(None, ge=1)
    position_embedding_type: PositionEmbeddingType = checked("learned_absolute")
    rotary_base: float = checked(10000.0, gt=0)
    rotary_percent: float = checked(1.0, gt=0, le=1)
    rope_scaling_type: RopeScalingType | None = checked(None)
    rope_scaling_factor: float = checked(1.0, gt=0)
    rope_low_freq_factor: float = checked(1.0, gt=0)
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = checked(8192, ge=1)
    normalization: Normalization = checked("LayerNorm")
    norm_epsilon: float = checked(1e-5, gt=0)
    activation: Activation = checked("gelu")
    add_bias_linear: bool = checked(True)
    add_qkv_bias: bool | None = checked(None)
    qk_layernorm: bool = checked(False)
    sliding_window: int | None = checked(None, ge=1, none="full causal attention", note="tokens")
    untie_embeddings_and_output_weights: bool = checked(False)
    hidden_dropout: float = checked(0.1, ge=0, lt=1)
    attention_dropout: float = checked(0.1, ge=0, lt=1)
    init_method_std: float = checked(0.02, gt=0)
    type: ModelType = checked("gpt")
    num_tokentypes: int = checked(0, ge=0)
    bert_binary_head: bool = checked(False)
    transformer_block_type: TransformerBlockType = checked("pre_ln")
    token_dropout: bool = checked(False)
    mask_token_id: int | None = None
    pad_token_id: int | None = None
    head: Head = checked("mlm", group="head")
    num_labels: int = 1
    head_hidden_size: int | None = checked(None, ge=1, group="head")
    head_dropout: float = checked(0.25, ge=0, lt=1, group="head")
    residue_head: ResidueHead = checked("conv", group="head")
    head_transform: HeadTransform = checked("none", group="head")
    head_bias: bool = checked(True, group="head")
    freeze_encoder: bool = checked(False, group="head")
    lora_rank: int = checked(0, ge=0, group="head")
    lora_alpha: float = checked(16.0, gt=0, group="head")
    lora_dropout: float = checked(0.0, ge=0, lt=1, group="head")
    lora_target_modules: str = "wq,wv"
    encoder_num_layers: int | None = checked(None, ge=1, none="= num_layers", group="t5")
    decoder_num_layers: int | None = checked(None, ge=1, none="= num_layers", group="t5")
    relative_attention_num_buckets: int = checked(32, ge=4, even=True, group="t5")
    relative_attention_max_distance: int = checked(128, ge=1, group="t5")
    softmax_scale: float | None = checked(None, gt=0, none="= 1/sqrt(head_dim)", group="t5")
    output_bias: bool = checked(False, group="t5")
    scale_decoder_output: bool = checked(False, group="t5")
    num_experts: int | None = checked(None, ge=1, none="a dense model", group="moe")
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = checked(None, ge=1, group="moe")
    moe_shared_expert_intermediate_size: int | None = checked(None, ge=1, group="moe")
    moe_shared_expert_gate: bool = checked(False, group="moe")
    moe_router_pre_softmax: bool = checked(False, group="moe")
    moe_aux_loss_coeff: float = checked(0.0, ge=0, what="a number", group="moe")
    moe_z_loss_coeff: float = checked(0.0, ge=0, what="a number", group="moe")
    moe_expert_capacity_factor: float | None = checked(
        None, gt=0, none="dropless routing", what="a number", group="moe"
    )
    moe_layer_freq: int | list[int] = 1
    moe_router_score_function: RouterScore = checked("softmax", group="moe")
    moe_router_enable_expert_bias: bool = checked(False, group="moe")
    moe_router_bias_update_rate: float = checked(1e-3, gt=0, what="a number", group="moe")
    moe_router_num_groups: int | None = checked(None, ge=1, none="no group limit", group="moe")
    moe_router_group_topk: int | None = checked(None, ge=1, none="no group limit", group="moe")
    moe_router_topk_scaling_factor: float | None = checked(
        None, gt=0, none="1 (no scaling)", what="a number", group="moe"
    )
    moe_router_load_balancing_type: BalanceLoss = checked("aux_loss", group="moe")
    moe_grouped_gemm: bool = checked(False, group="moe")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def padded_vocab_size(self) -> int:
        """``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by``."""
        m = self.make_vocab_size_divisible_by
        return int(math.ceil(self.vocab_size / m) * m)

    @property
    def softmax_vocab_size(self) -> int:
        """The logit columns the loss's softmax covers: :attr:`padded_vocab_size`, or
        ``vocab_size`` when ``padded_vocab_in_softmax`` is false."""
        return self.padded_vocab_size if self.padded_vocab_in_softmax else self.vocab_size

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
    def moe_ffn_size(self) -> int:
        """Each routed expert's inner width (``moe_ffn_hidden_size`` or :attr:`ffn_size`)."""
        return self.ffn_size if self.moe_ffn_hidden_size is None else self.moe_ffn_hidden_size

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
        existed; every type but T5 omits the T5 fields (:data:`T5_FIELDS`); a dense model
        omits the mixture-of-experts fields (:data:`MOE_FIELDS`); ``padded_vocab_in_softmax``
        is written only when false; :meth:`from_dict` reads such a dict back as ``type="gpt"``.
        """
        values = dataclasses.asdict(self)
        if self.padded_vocab_in_softmax:
            del values["padded_vocab_in_softmax"]
        if self.type == "gpt":
            for name in ENCODER_FIELDS:
                del values[name]
        if self.type != "t5":
            for name in T5_FIELDS:
                del values[name]
        if self.num_experts is None:
            for name in MOE_FIELDS:
                del values[name]
        return values

    def resolved_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` with the derived options resolved, for comparing two spellings of one model.

        ``ffn_hidden_size``, ``moe_ffn_hidden_size``, ``kv_channels``,
        ``num_query_groups`` and ``add_qkv_bias`` hold the value their ``None`` stands
        for (:attr:`ffn_size`, :attr:`moe_ffn_size`, :attr:`head_dim`,
        :attr:`num_kv_heads`, :attr:`qkv_bias`): a Hugging Face ``intermediate_size=128``
        read back as ``None`` (the default width of a 64-wide SwiGLU) and an explicit 128
        are the same model.
        """
        values = self.to_dict()
        for name, resolved in _DERIVED_OPTIONS.items():
            if name in values:
                values[name] = getattr(self, resolved)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Build from a dict, rejecting unknown and missing required keys with a :class:`ConfigError`."""
        fields = dataclasses.fields(cls)
        known = {f.name for f in fields}
        for key in values:
            require(key in known, str(key), f"unknown model option; known: {sorted(known)}")
        for f in fields:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            require(not required or f.name in values, f.name, "missing (a required model option)")
        return cls(**values)
