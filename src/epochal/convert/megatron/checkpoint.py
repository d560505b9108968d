"""A Megatron checkpoint in our names: whole Megatron-Core tensors <-> our state dict.

:class:`MegatronCheckpoint` is what every Megatron reader returns (legacy files,
``torch_dist``, NeMo 2). :func:`checkpoint_from_megatron_tensors` turns whole (unsharded)
Megatron-Core tensors and an ``args`` namespace into our config and names (GPT, BERT and
BioNeMo's ESM-2); the reverse mapping serves :mod:`epochal.convert.megatron.legacy_save`.
"""

from __future__ import annotations

import dataclasses
import warnings
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from epochal.convert.megatron.args import MegatronExtras, config_from_megatron_args
from epochal.convert.megatron.layout import (
    interleaved_to_half_rotary,
    megatron_model_type,
    pack_qkv,
    to_local_names,
    unpack_qkv,
)
from epochal.formats.common import ConversionError, attach_output_head, check_shapes, resize_rows
from epochal.model.config import ModelConfig
from epochal.model.moe_options import is_moe_layer


@dataclass
class MegatronCheckpoint:
    """A Megatron checkpoint read into our names.

    Attributes:
        config: our model config.
        state: our state dict (full CPU tensors).
        args: the ``args`` namespace of rank 0's file.
        iteration: the iteration, or None for a ``release`` checkpoint.
        tensor_parallel, pipeline_parallel: the layout that was read.
    """

    config: ModelConfig
    state: dict[str, torch.Tensor]
    args: Namespace
    iteration: int | None
    tensor_parallel: int
    pipeline_parallel: int


def _megatron_full_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Our names -> full (unsharded) Megatron-Core local-spec names, vocabulary as ours."""
    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": state["tok_embeddings.weight"]
    }
    if config.position_embedding_type == "learned_absolute":
        out["embedding.position_embeddings.weight"] = state["pos_embeddings.weight"]
    groups, hd = config.num_kv_heads, config.head_dim
    for i in range(config.num_layers):
        src, dst = f"layers.{i}.", f"decoder.layers.{i}."
        for ours, theirs in (
            ("attention_norm", "input_layernorm"),
            ("ffn_norm", "pre_mlp_layernorm"),
        ):
            for kind in ("weight", "bias"):
                if f"{src}{ours}.{kind}" in state:
                    out[f"{dst}{theirs}.{kind}"] = state[f"{src}{ours}.{kind}"]
        for kind in ("weight", "bias"):
            if f"{src}attention.wq.{kind}" in state:
                out[f"{dst}self_attention.linear_qkv.{kind}"] = pack_qkv(
                    *(state[f"{src}attention.{p}.{kind}"] for p in ("wq", "wk", "wv")), groups, hd
                )
            if f"{src}attention.wo.{kind}" in state:
                out[f"{dst}self_attention.linear_proj.{kind}"] = state[f"{src}attention.wo.{kind}"]
        if is_moe_layer(config, i):
            out.update(_moe_from_ours(state, f"{src}mlp.", f"{dst}mlp.", config))
        else:
            out.update(_mlp_from_ours(state, f"{src}mlp.", f"{dst}mlp.", config))
    for kind in ("weight", "bias"):
        if f"norm.{kind}" in state:
            out[f"decoder.final_layernorm.{kind}"] = state[f"norm.{kind}"]
    if not config.tie_embeddings:
        out["output_layer.weight"] = state["output.weight"]
    if config.type == "bert":
        for ours, theirs in _BERT_NAMES:
            if ours in state:
                out[theirs] = state[ours]
    return out


def _mlp_from_ours(
    state: Mapping[str, torch.Tensor], src: str, dst: str, config: ModelConfig
) -> dict[str, torch.Tensor]:
    """One of our MLPs (``src``: ``w1/w3/w2`` or ``fc1/fc2``) as Megatron's ``linear_fc1/fc2`` at ``dst``."""
    out: dict[str, torch.Tensor] = {}
    for kind in ("weight", "bias"):
        if config.activation == "swiglu":
            if f"{src}w1.{kind}" in state:
                out[f"{dst}linear_fc1.{kind}"] = torch.cat(
                    [state[f"{src}w1.{kind}"], state[f"{src}w3.{kind}"]]
                )
                out[f"{dst}linear_fc2.{kind}"] = state[f"{src}w2.{kind}"]
        elif f"{src}fc1.{kind}" in state:
            out[f"{dst}linear_fc1.{kind}"] = state[f"{src}fc1.{kind}"]
            out[f"{dst}linear_fc2.{kind}"] = state[f"{src}fc2.{kind}"]
    return out


def _moe_from_ours(
    state: Mapping[str, torch.Tensor], src: str, dst: str, config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Our MoE MLP at ``src`` as Megatron-Core's ``MoELayer`` at ``dst`` (:mod:`~epochal.convert.megatron.moe`)."""
    out = {f"{dst}router.weight": state[f"{src}router.weight"]}
    if f"{src}expert_bias" in state:  # the auxiliary-loss-free balancing bias
        out[f"{dst}router.expert_bias"] = state[f"{src}expert_bias"]
    for e in range(config.num_experts or 0):
        out.update(
            _mlp_from_ours(state, f"{src}experts.{e}.", f"{dst}experts.local_experts.{e}.", config)
        )
    out.update(_mlp_from_ours(state, f"{src}shared_expert.", f"{dst}shared_experts.", config))
    if f"{src}shared_expert_gate.weight" in state:
        out[f"{dst}shared_experts.gate_weight"] = state[f"{src}shared_expert_gate.weight"]
    return out


#: BERT-only tensors: our name -> Megatron-Core ``BertModel``'s (full, unsharded).
_BERT_NAMES = (
    ("tokentype_embeddings.weight", "embedding.tokentype_embeddings.weight"),
    ("lm_head.dense.weight", "lm_head.dense.weight"),
    ("lm_head.dense.bias", "lm_head.dense.bias"),
    ("lm_head.norm.weight", "lm_head.layer_norm.weight"),
    ("lm_head.norm.bias", "lm_head.layer_norm.bias"),
    ("lm_head.bias", "output_layer.bias"),
    ("pooler.dense.weight", "pooler.dense.weight"),
    ("pooler.dense.bias", "pooler.dense.bias"),
    ("binary_head.weight", "binary_head.weight"),
    ("binary_head.bias", "binary_head.bias"),
)


def _ours_from_megatron_full(
    full: dict[str, torch.Tensor], config: ModelConfig, extras: MegatronExtras, source: str
) -> dict[str, torch.Tensor]:
    """Full Megatron-Core local-spec names -> ours (vocabulary resized to ours)."""
    full = dict(full)
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        try:
            return full.pop(name)
        except KeyError:
            raise ConversionError(f"{source}: missing tensor {name!r}") from None

    def norm(name: str) -> torch.Tensor:
        t = take(name)
        return t + 1 if extras.apply_layernorm_1p and name.endswith("weight") else t

    bias_names = ("weight", "bias") if config.normalization == "LayerNorm" else ("weight",)
    linear_kinds = ("weight", "bias") if config.add_bias_linear else ("weight",)
    qkv_kinds = ("weight", "bias") if config.qkv_bias else ("weight",)
    heads, groups, hd = config.num_attention_heads, config.num_kv_heads, config.head_dim
    out["tok_embeddings.weight"] = resize_rows(
        take("embedding.word_embeddings.weight"), config.padded_vocab_size
    )
    if config.position_embedding_type == "learned_absolute":
        out["pos_embeddings.weight"] = take("embedding.position_embeddings.weight")
    for i in range(config.num_layers):
        src, dst = f"decoder.layers.{i}.", f"layers.{i}."
        for kind in bias_names:
            out[f"{dst}attention_norm.{kind}"] = norm(f"{src}input_layernorm.{kind}")
            out[f"{dst}ffn_norm.{kind}"] = norm(f"{src}pre_mlp_layernorm.{kind}")
        for kind in qkv_kinds:
            q, k, v = unpack_qkv(take(f"{src}self_attention.linear_qkv.{kind}"), heads, groups, hd)
            if extras.rotary_interleaved:
                q = interleaved_to_half_rotary(q, heads, hd, config.rotary_dim)
                k = interleaved_to_half_rotary(k, groups, hd, config.rotary_dim)
            out[f"{dst}attention.wq.{kind}"] = q
            out[f"{dst}attention.wk.{kind}"] = k
            out[f"{dst}attention.wv.{kind}"] = v
        for kind in linear_kinds:
            out[f"{dst}attention.wo.{kind}"] = take(f"{src}self_attention.linear_proj.{kind}")

        def mlp(theirs: str, ours: str) -> None:
            for kind in linear_kinds:
                fc1 = take(f"{theirs}linear_fc1.{kind}")
                fc2 = take(f"{theirs}linear_fc2.{kind}")
                if config.activation == "swiglu":
                    gate, up = fc1.chunk(2, dim=0)
                    out[f"{ours}w1.{kind}"] = gate.contiguous()
                    out[f"{ours}w3.{kind}"] = up.contiguous()
                    out[f"{ours}w2.{kind}"] = fc2
                else:
                    out[f"{ours}fc1.{kind}"] = fc1
                    out[f"{ours}fc2.{kind}"] = fc2

        if not is_moe_layer(config, i):
            mlp(f"{src}mlp.", f"{dst}mlp.")
            continue
        out[f"{dst}mlp.router.weight"] = take(f"{src}mlp.router.weight")
        if config.moe_router_enable_expert_bias:
            out[f"{dst}mlp.expert_bias"] = take(f"{src}mlp.router.expert_bias")
        for e in range(config.num_experts):
            mlp(f"{src}mlp.experts.local_experts.{e}.", f"{dst}mlp.experts.{e}.")
        if config.moe_shared_expert_intermediate_size is not None:
            mlp(f"{src}mlp.shared_experts.", f"{dst}mlp.shared_expert.")
            if config.moe_shared_expert_gate:
                out[f"{dst}mlp.shared_expert_gate.weight"] = take(
                    f"{src}mlp.shared_experts.gate_weight"
                )
    for kind in bias_names:
        out[f"norm.{kind}"] = norm(f"decoder.final_layernorm.{kind}")
    if config.is_encoder:  # BERT, and ESM-2 (BioNeMo: a BertModel)
        for ours, theirs in _BERT_NAMES:
            if theirs == "embedding.tokentype_embeddings.weight" and not config.num_tokentypes:
                continue
            if theirs.startswith(("pooler.", "binary_head.")) and not config.bert_binary_head:
                continue
            if theirs == "output_layer.bias":
                out[ours] = resize_rows(take(theirs), config.padded_vocab_size)
            elif theirs.startswith("lm_head.layer_norm."):
                out[ours] = norm(theirs)
            else:
                out[ours] = take(theirs)
    head = full.pop("output_layer.weight", None)
    out = attach_output_head(config, out, head, source=source, head_name="output_layer.weight")
    if full:
        raise ConversionError(f"{source}: tensors the config does not explain: {sorted(full)[:8]}")
    check_shapes(out, config, source)
    return out


def _bert_config(
    config: ModelConfig,
    args: Namespace,
    first: Mapping[str, Any],
    last: Mapping[str, Any],
    source: str,
    *,
    esm: Mapping[str, Any] | None = None,
) -> ModelConfig:
    """``config`` (read from ``args`` as for GPT) made a BERT from the first and last stages' tensors.

    ``num_tokentypes`` is the row count of ``embedding.tokentype_embeddings``
    (0 without it); ``bert_binary_head`` is whether ``binary_head`` exists, and
    must agree with ``args.bert_binary_head`` when that is recorded.

    Raises:
        ConversionError: ``args.bert_binary_head`` contradicts the tensors.
    """
    types = first.get("embedding.tokentype_embeddings.weight")
    binary = "binary_head.weight" in last
    said = getattr(args, "bert_binary_head", None)
    if said is not None and bool(said) != binary:
        raise ConversionError(
            f"{source}: args.bert_binary_head={said!r}, but the last pipeline stage "
            f"{'has' if binary else 'has no'} binary_head tensors"
        )
    if config.activation == "gelu_tanh":
        warnings.warn(
            f"{source}: the checkpoint's MLP uses the tanh GELU (openai_gelu or Megatron's "
            "fused bias-GELU); it imports as activation='gelu_tanh', which our masked-LM head "
            "uses too, where Megatron-Core's BertLMHead applies the exact GELU",
            stacklevel=3,
        )
    if esm is not None:
        if types is not None or binary:
            raise ConversionError(
                f"{source}: an ESM-2 model has no token types and no binary head, "
                "but the checkpoint has them"
            )
        return dataclasses.replace(config, type="esm", **esm)
    return dataclasses.replace(
        config,
        type="bert",
        num_tokentypes=0 if types is None else int(types.shape[0]),
        bert_binary_head=binary,
    )


def checkpoint_from_megatron_tensors(
    flat: dict[str, torch.Tensor],
    args: Namespace,
    *,
    iteration: int | None,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    model_type: str | None = None,
    source: str,
    esm: Mapping[str, Any] | None = None,
    unknown_tp: bool = False,
) -> MegatronCheckpoint:
    """Whole Megatron-Core tensors (any naming, layers ``decoder/encoder.layers.{i}``) into ours.

    Args:
        flat: full (unsharded) tensors by Megatron-Core name.
        args: a Megatron-LM ``args`` namespace describing the model.
        iteration: recorded in the result.
        vocab_size, make_vocab_size_divisible_by: as for :func:`load_megatron_checkpoint`.
        model_type: the expected ``"gpt"`` / ``"bert"`` (None: what the names show).
        source: named in errors.
        esm: for a ``BertModel`` that is an ESM-2 (BioNeMo): our ESM fields
            (``token_dropout``, ``mask_token_id``, ``pad_token_id``); the result has
            ``type="esm"``.
        unknown_tp: the saving job's tensor-parallel size is not recorded (NeMo 2), so
            the vocabulary padding is bounded by :data:`~epochal.convert.megatron.args.UNKNOWN_TP_BOUND`.

    Raises:
        ConversionError: the names show another model than ``model_type``, or the
            tensors do not match ``args``.
    """
    found_type = megatron_model_type(flat)
    if model_type is not None and found_type != model_type:
        raise ConversionError(
            f"{source}: holds a {found_type!r} model, expected model.type={model_type!r}"
        )
    embedding = flat.get("embedding.word_embeddings.weight")
    config, extras = config_from_megatron_args(
        args,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        source=source,
        embedding_rows=int(embedding.shape[0])
        if isinstance(embedding, torch.Tensor) and embedding.dim() == 2
        else None,
        unknown_tp=unknown_tp,
    )
    full = to_local_names(flat, source)
    if found_type == "bert":
        config = _bert_config(config, args, full, full, source, esm=esm)
    state = _ours_from_megatron_full(full, config, extras, source)
    return MegatronCheckpoint(
        config=config,
        state=state,
        args=args,
        iteration=iteration,
        tensor_parallel=extras.tensor_parallel,
        pipeline_parallel=extras.pipeline_parallel,
    )
