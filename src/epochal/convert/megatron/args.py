"""Megatron-LM's ``args`` namespace <-> our :class:`ModelConfig`.

Export writes the arguments Megatron-LM's ``load_checkpoint`` checks
(``num_layers``, ``hidden_size``, ``num_attention_heads``,
``max_position_embeddings``, ``make_vocab_size_divisible_by``,
``padded_vocab_size``, ``tensor_model_parallel_size``,
``pipeline_model_parallel_size``, ...) and those its conversion tools read
(``--use-checkpoint-args``), plus ``vocab_size`` (the unpadded size) so that an
import restores the exact vocabulary.

Import reads the same names, with the defaults Megatron-LM used when an older
checkpoint lacks one (``layernorm_epsilon`` for ``norm_epsilon``,
``use_rotary_position_embeddings`` for ``position_embedding_type="rope"``).
Decisions where Megatron's behaviour is implicit:

- GELU: ``openai_gelu`` -> ``gelu_tanh``. Megatron also uses the tanh
  approximation when its fused bias-GELU kernel is on (``bias_gelu_fusion`` /
  ``bias_activation_fusion`` with biases, the default), so such checkpoints
  import as ``gelu_tanh`` too; otherwise ``gelu`` (exact). Exports of ``gelu``
  set both fusion flags to False, of ``gelu_tanh`` set ``openai_gelu``.
- QKV bias: Megatron's fused QKV has a bias when ``add_bias_linear or
  add_qkv_bias``, so a model with linear biases but no QKV bias cannot be exported.
- RoPE scaling: ``use_rope_scaling`` (``--use-rope-scaling``) with
  ``rope_scaling_factor`` (``--rope-scaling-factor``, default 8) is our
  ``rope_scaling_type="llama3"``; Megatron-Core's ``RotaryEmbedding._apply_scaling``
  hard-codes ``low_freq_factor=1``, ``high_freq_factor=4`` and
  ``original_max_position_embeddings=8192``, so other values cannot be exported.
  ``rotary_seq_len_interpolation_factor`` (``--rotary-seq-len-interpolation-factor``,
  an integer; positions multiplied by ``1 / factor``) is our ``"linear"``; 1 means
  no scaling, and only integer factors >= 1 export. Both at once is refused.
- BERT (``model.type="bert"``): Megatron-Core's ``BertModel`` is pre-LN and its
  masked-LM head always applies the exact (erf) GELU, so only ``pre_ln`` BERTs
  with ``activation="gelu"`` export; ``bert_binary_head`` is written, and
  ``num_tokentypes`` (not a Megatron-LM argument: ``pretrain_bert.py`` derives
  it as ``2 if bert_binary_head else 0``) is written for reference. On import
  the model type and these two fields come from the tensors
  (:mod:`epochal.convert.megatron.legacy`). A BERT whose ``args`` give a tanh
  GELU (``openai_gelu``, or the fused bias-GELU that Megatron-LM enables by
  default) imports as ``gelu_tanh``, with a warning: our head then uses the tanh
  GELU too, Megatron's the exact one. ESM models have no Megatron counterpart.
- Mixture of experts: ``num_experts``, ``moe_router_topk``, ``moe_ffn_hidden_size``,
  ``moe_shared_expert_intermediate_size``, ``moe_shared_expert_gate``,
  ``moe_router_pre_softmax``, ``moe_aux_loss_coeff``, ``moe_z_loss_coeff``,
  ``moe_expert_capacity_factor``, ``moe_layer_freq`` carry over by name both ways, with
  ``expert_model_parallel_size`` (and ``expert_tensor_parallel_size`` = TP) for the
  layout; routing epochal does not build (sigmoid scores, a top-k scaling factor,
  expert bias, group-limited routing, input jitter, Sinkhorn, position-based token
  dropping, latent experts) is refused by name: :mod:`epochal.convert.megatron.moe`.
- Unsupported features raise :class:`ConversionError`: ``qk_layernorm``, ``apply_rope_fusion_scaling``, ALiBi (Megatron-Core has
  none), squared ReLU; on export also our ``qk_layernorm`` and ``sliding_window``.
"""

from __future__ import annotations

import math
from argparse import Namespace
from dataclasses import dataclass
from typing import Any

import torch

from epochal.convert.megatron.moe import (
    expert_parallel_size,
    moe_args_from_config,
    moe_fields_from_args,
)
from epochal.formats.checked_config import (
    MEGATRON_SCHEMA,
    ConfigFieldError,
    check_fields,
    check_positions,
    check_vocab_rows,
)
from epochal.formats.common import ConversionError, normalize_config
from epochal.model.config import ConfigError, ModelConfig

__all__ = [
    "MegatronExtras",
    "config_from_megatron_args",
    "megatron_args_from_config",
    "megatron_padded_vocab_size",
]

CHECKPOINT_VERSION = 3.0


def megatron_padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Megatron's padding: ``vocab_size`` rounded up to a multiple of ``divisible_by * TP``."""
    multiple = divisible_by * tensor_parallel
    return int(math.ceil(vocab_size / multiple) * multiple)


def megatron_args_from_config(
    config: ModelConfig,
    *,
    tensor_parallel: int,
    pipeline_parallel: int,
    iteration: int,
    dtype: torch.dtype,
    transformer_impl: str,
    expert_parallel: int = 1,
) -> Namespace:
    """The ``args`` namespace stored in every exported rank file.

    ``expert_parallel`` is the expert-parallel size of the files (Megatron-LM's
    ``--expert-model-parallel-size``; mixture-of-experts models only, carved from the
    data-parallel ranks, so ``data_parallel_size`` is written as that size).

    Raises:
        ConversionError: ``config`` uses something Megatron-Core cannot express.
    """
    if config.type == "esm":
        raise ConversionError(
            "cannot export to Megatron: model.type='esm' has no Megatron-LM counterpart "
            "(export ESM models to Hugging Face with --to hf)"
        )
    if config.type == "bert":
        if config.transformer_block_type != "pre_ln":
            raise ConversionError(
                "cannot export to Megatron: model.type='bert' with transformer_block_type="
                f"{config.transformer_block_type!r} (Megatron-Core's BertModel is pre-LN; "
                "export post-LN BERTs to Hugging Face with --to hf)"
            )
        if config.activation != "gelu":
            raise ConversionError(
                "cannot export to Megatron: model.type='bert' with "
                f"activation={config.activation!r} "
                "(Megatron-Core's BertLMHead always uses the exact GELU, so only "
                "activation='gelu' gives the same logits)"
            )
    if config.position_embedding_type == "alibi":
        raise ConversionError("cannot export to Megatron: Megatron-Core GPT has no ALiBi positions")
    if config.qk_layernorm:
        raise ConversionError(
            "cannot export to Megatron: qk_layernorm=True is not written to Megatron checkpoints "
            "(export it to Hugging Face with --to hf: Qwen3ForCausalLM)"
        )
    if config.sliding_window is not None:
        raise ConversionError(
            f"cannot export to Megatron: sliding_window={config.sliding_window} is not written to "
            "Megatron checkpoints (export it to Hugging Face with --to hf: MistralForCausalLM)"
        )
    if config.add_bias_linear and not config.qkv_bias:
        raise ConversionError(
            "cannot export to Megatron: add_bias_linear=True with add_qkv_bias=False "
            "(Megatron's fused QKV always has a bias when add_bias_linear is set)"
        )
    heads = config.num_attention_heads
    gqa = config.num_kv_heads != heads
    args: dict[str, Any] = {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "ffn_hidden_size": config.ffn_size,
        "num_attention_heads": heads,
        "kv_channels": config.head_dim,
        "group_query_attention": gqa,
        "num_query_groups": config.num_kv_heads,
        "max_position_embeddings": config.max_position_embeddings,
        "seq_length": config.max_position_embeddings,
        "position_embedding_type": config.position_embedding_type,
        "add_position_embedding": config.position_embedding_type == "learned_absolute",
        "use_rotary_position_embeddings": config.position_embedding_type == "rope",
        "rotary_base": int(config.rotary_base)
        if float(config.rotary_base).is_integer()
        else config.rotary_base,
        "rotary_percent": config.rotary_percent,
        "rotary_interleaved": False,
        **_rope_scaling_args(config),
        "normalization": config.normalization,
        "norm_epsilon": config.norm_epsilon,
        "layernorm_epsilon": config.norm_epsilon,
        "apply_layernorm_1p": False,
        "swiglu": config.activation == "swiglu",
        "openai_gelu": config.activation == "gelu_tanh",
        "squared_relu": False,
        "bias_gelu_fusion": False,
        "bias_activation_fusion": False,
        "add_bias_linear": config.add_bias_linear,
        "add_qkv_bias": config.qkv_bias,
        "untie_embeddings_and_output_weights": config.untie_embeddings_and_output_weights,
        "hidden_dropout": config.hidden_dropout,
        "attention_dropout": config.attention_dropout,
        "init_method_std": config.init_method_std,
        "qk_layernorm": False,
        **moe_args_from_config(
            config, tensor_parallel=tensor_parallel, expert_parallel=expert_parallel
        ),
        "vocab_size": config.vocab_size,
        "make_vocab_size_divisible_by": config.make_vocab_size_divisible_by,
        "padded_vocab_size": megatron_padded_vocab_size(
            config.vocab_size, config.make_vocab_size_divisible_by, tensor_parallel
        ),
        "tokenizer_type": None,
        "tensor_model_parallel_size": tensor_parallel,
        "pipeline_model_parallel_size": pipeline_parallel,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 1,
        "data_parallel_size": expert_parallel,
        "world_size": tensor_parallel * pipeline_parallel * expert_parallel,
        "sequence_parallel": False,
        "transformer_impl": transformer_impl,
        "use_mcore_models": True,
        "use_legacy_models": False,
        "ckpt_format": "torch",
        "params_dtype": dtype,
        "fp16": dtype == torch.float16,
        "bf16": dtype == torch.bfloat16,
        "iteration": iteration,
        "consumed_train_samples": 0,
        "consumed_valid_samples": 0,
        "apply_query_key_layer_scaling": False,
        "bert_binary_head": config.bert_binary_head,
        "num_tokentypes": config.num_tokentypes,
    }
    return Namespace(**args)


# Megatron-Core's RotaryEmbedding._apply_scaling defaults, which Megatron-LM never overrides.
_MCORE_LLAMA3 = {
    "rope_low_freq_factor": 1.0,
    "rope_high_freq_factor": 4.0,
    "rope_original_max_position_embeddings": 8192,
}
_MCORE_DEFAULT_ROPE_SCALING_FACTOR = 8.0  # --rope-scaling-factor's default


def _rope_scaling_args(config: ModelConfig) -> dict[str, Any]:
    """``use_rope_scaling``, ``rope_scaling_factor`` and ``rotary_seq_len_interpolation_factor``.

    Raises:
        ConversionError: scaling Megatron cannot express (see the module docstring).
    """
    kind, factor = config.rope_scaling_type, config.rope_scaling_factor
    if kind == "llama3":
        bad = [
            f"{k}={getattr(config, k)!r}"
            for k, v in _MCORE_LLAMA3.items()
            if getattr(config, k) != v
        ]
        if bad:
            raise ConversionError(
                f"cannot export to Megatron: rope_scaling_type='llama3' with {', '.join(bad)} "
                "(Megatron-Core's --use-rope-scaling hard-codes rope_low_freq_factor=1, "
                "rope_high_freq_factor=4, rope_original_max_position_embeddings=8192)"
            )
    if kind == "linear" and not (float(factor).is_integer() and factor >= 1):
        raise ConversionError(
            f"cannot export to Megatron: rope_scaling_type='linear' with rope_scaling_factor={factor!r} "
            "(Megatron-LM's --rotary-seq-len-interpolation-factor is an integer >= 1)"
        )
    return {
        "use_rope_scaling": kind == "llama3",
        "rope_scaling_factor": factor if kind == "llama3" else _MCORE_DEFAULT_ROPE_SCALING_FACTOR,
        "rotary_seq_len_interpolation_factor": int(factor) if kind == "linear" else None,
    }


def _rope_scaling_fields(args: Namespace, source: str) -> dict[str, Any]:
    """Our ``rope_scaling_*`` fields from ``args`` (rope positions only).

    Raises:
        ConversionError: llama3 scaling and a sequence-length interpolation factor together.
    """
    llama3 = _get(args, "use_rope_scaling", False) is True
    linear = _get(args, "rotary_seq_len_interpolation_factor")
    if linear is not None and float(linear) == 1.0:
        linear = None  # Megatron scripts pass 1 for "no interpolation"
    if llama3 and linear is not None:
        raise ConversionError(
            f"{source}: args.use_rope_scaling=True together with "
            f"args.rotary_seq_len_interpolation_factor={linear!r} is not supported"
        )
    if llama3:
        factor = float(_get(args, "rope_scaling_factor", _MCORE_DEFAULT_ROPE_SCALING_FACTOR))
        return {"rope_scaling_type": "llama3", "rope_scaling_factor": factor, **_MCORE_LLAMA3}
    if linear is not None:
        return {"rope_scaling_type": "linear", "rope_scaling_factor": float(linear)}
    return {}


@dataclass
class MegatronExtras:
    """Layout facts of an imported checkpoint that are not part of :class:`ModelConfig`.

    Attributes:
        swiglu: ``linear_fc1`` is a fused ``[gate; up]``.
        rotary_interleaved: q/k rows use interleaved RoPE pairs (permuted on import).
        apply_layernorm_1p: norm weights are stored minus one (``--apply-layernorm-1p``).
        tensor_parallel, pipeline_parallel, expert_parallel: the sizes recorded in ``args``.
    """

    swiglu: bool
    rotary_interleaved: bool
    apply_layernorm_1p: bool
    tensor_parallel: int
    pipeline_parallel: int
    expert_parallel: int = 1


def _get(args: Namespace, name: str, default: Any = None) -> Any:
    value = getattr(args, name, default)
    return default if value is None else value


def config_from_megatron_args(
    args: Namespace,
    *,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    source: str = "Megatron checkpoint",
    embedding_rows: int | None = None,
    unknown_tp: bool = False,
) -> tuple[ModelConfig, MegatronExtras]:
    """Our config (and layout facts) from a Megatron ``args`` namespace.

    Args:
        args: the checkpoint's ``args``.
        vocab_size: the unpadded vocabulary; default ``args.vocab_size``, else
            ``args.padded_vocab_size`` (then every padded row counts as a token).
        make_vocab_size_divisible_by: our padding multiple; default Megatron's.
        source: named in error messages.
        embedding_rows: the checkpoint's (full) embedding rows: the vocabulary fields
            are checked against them (:func:`_check_vocab`) before any row is cut or padded.
        unknown_tp: the tensor-parallel size of the save is not recorded (NeMo 2): its
            padding is assumed to be for TP <= :data:`UNKNOWN_TP_BOUND`.

    Raises:
        ConversionError: a required argument is missing or a feature is unsupported.
        ConfigFieldError: an argument of the wrong type or range, or a vocabulary that
            contradicts ``embedding_rows`` (names the argument).
    """
    if not isinstance(args, Namespace):
        raise ConversionError(
            f"{source}: 'args' is {type(args).__name__}, expected an argparse.Namespace"
        )
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        if getattr(args, name, None) is None:
            raise ConversionError(f"{source}: args has no {name!r}")
    check_fields(vars(args), MEGATRON_SCHEMA, source, prefix="args.")
    for name in ("max_position_embeddings", "seq_length"):
        check_positions(getattr(args, name, None), source, f"args.{name}")
    moe = moe_fields_from_args(args, source)
    for flag in ("qk_layernorm", "squared_relu", "apply_rope_fusion_scaling"):
        if _get(args, flag, False) is True:
            raise ConversionError(f"{source}: args.{flag}=True is not supported")
    pos = _get(args, "position_embedding_type")
    if pos is None:
        pos = "rope" if _get(args, "use_rotary_position_embeddings", False) else "learned_absolute"
    if pos not in ("learned_absolute", "rope", "none"):
        raise ConversionError(f"{source}: position_embedding_type={pos!r} is not supported")
    heads = int(args.num_attention_heads)
    groups = (
        int(_get(args, "num_query_groups", heads))
        if _get(args, "group_query_attention", False)
        else heads
    )
    hidden = int(args.hidden_size)
    head_dim = int(_get(args, "kv_channels", hidden // heads))
    swiglu = bool(_get(args, "swiglu", False))
    add_bias = bool(_get(args, "add_bias_linear", True))
    if swiglu:
        activation = "swiglu"
    elif _get(args, "openai_gelu", False):
        activation = "gelu_tanh"
    elif add_bias and (
        _get(args, "bias_gelu_fusion", False) or _get(args, "bias_activation_fusion", False)
    ):
        activation = "gelu_tanh"  # Megatron's fused bias-GELU kernel is the tanh approximation
    else:
        activation = "gelu"
    padded = _get(args, "padded_vocab_size")
    vocab = vocab_size if vocab_size is not None else _get(args, "vocab_size", padded)
    if vocab is None:
        raise ConversionError(
            f"{source}: args has neither vocab_size nor padded_vocab_size; pass vocab_size"
        )
    divisible = make_vocab_size_divisible_by or int(_get(args, "make_vocab_size_divisible_by", 128))
    if embedding_rows is not None:
        _check_vocab(args, vocab_size, embedding_rows, source, unknown_tp=unknown_tp)
    epsilon = _get(args, "norm_epsilon", _get(args, "layernorm_epsilon", 1e-5))
    try:
        config = ModelConfig(
            vocab_size=int(vocab),
            make_vocab_size_divisible_by=divisible,
            hidden_size=hidden,
            num_layers=int(args.num_layers),
            num_attention_heads=heads,
            num_query_groups=None if groups == heads else groups,
            kv_channels=None if head_dim * heads == hidden else head_dim,
            ffn_hidden_size=int(_get(args, "ffn_hidden_size", 4 * hidden)),
            max_position_embeddings=int(
                _get(args, "max_position_embeddings", _get(args, "seq_length", 2048))
            ),
            position_embedding_type=pos,
            rotary_base=float(_get(args, "rotary_base", 10000)),
            rotary_percent=float(_get(args, "rotary_percent", 1.0)),
            **(_rope_scaling_fields(args, source) if pos == "rope" else {}),
            normalization=_get(args, "normalization", "LayerNorm"),
            norm_epsilon=float(epsilon),
            activation=activation,
            add_bias_linear=add_bias,
            add_qkv_bias=None if add_bias or not _get(args, "add_qkv_bias", False) else True,
            untie_embeddings_and_output_weights=bool(
                _get(args, "untie_embeddings_and_output_weights", False)
            ),
            hidden_dropout=float(_get(args, "hidden_dropout", 0.1)),
            attention_dropout=float(_get(args, "attention_dropout", 0.1)),
            init_method_std=float(_get(args, "init_method_std", 0.02)),
            **moe,
        )
    except ConfigError as exc:  # valid fields in a combination the model refuses
        raise ConfigFieldError(f"{source}: {exc}") from exc
    config = normalize_config(config)
    extras = MegatronExtras(
        swiglu=swiglu,
        rotary_interleaved=pos == "rope" and bool(_get(args, "rotary_interleaved", False)),
        apply_layernorm_1p=bool(_get(args, "apply_layernorm_1p", False)),
        tensor_parallel=_tensor_parallel(args),
        pipeline_parallel=int(_get(args, "pipeline_model_parallel_size", 1)),
        expert_parallel=expert_parallel_size(args, _tensor_parallel(args), source),
    )
    return config, extras


def _tensor_parallel(args: Namespace) -> int:
    return int(_get(args, "tensor_model_parallel_size", _get(args, "model_parallel_size", 1)))


#: NeMo records no tensor-parallel size; Megatron's padding is then assumed to be for TP <= 8.
UNKNOWN_TP_BOUND = 8


def _check_vocab(
    args: Namespace, vocab_size: int | None, rows: int, source: str, *, unknown_tp: bool
) -> None:
    """``args.padded_vocab_size`` / ``args.vocab_size`` (or ``vocab_size``) against the rows.

    ``padded_vocab_size`` must equal the rows; the unpadded vocabulary may be followed by
    at most Megatron's padding (``make_vocab_size_divisible_by`` x TP rows).

    Raises:
        ConfigFieldError: naming the field and the embedding.
    """
    tensor = "embedding.word_embeddings.weight"
    padded = _get(args, "padded_vocab_size")
    if padded is not None and not unknown_tp:
        check_vocab_rows(source, "args.padded_vocab_size", padded, rows, tensor)
    if vocab_size is not None:  # the caller's own: only never beyond the rows
        check_vocab_rows(source, "vocab_size", vocab_size, rows, tensor, max_padding=rows)
        return
    vocab = _get(args, "vocab_size")
    if vocab is None:
        return
    tp = UNKNOWN_TP_BOUND if unknown_tp else _tensor_parallel(args)
    multiple = int(_get(args, "make_vocab_size_divisible_by", 128)) * tp
    check_vocab_rows(source, "args.vocab_size", vocab, rows, tensor, max_padding=multiple)
