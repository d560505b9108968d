"""Hugging Face ``Glm4MoeForCausalLM`` (GLM-4.5) <-> ``GPTModel``.

A Llama-shaped decoder (:mod:`epochal.formats.hf.llama`) with biases on q, k and v
(``attention_bias``; none on ``o_proj``), optional per-head QK-norm (``use_qk_norm``),
RoPE over the first ``partial_rotary_factor`` of each head (``rotary_percent``), dense
first blocks and DeepSeek-V3's mixture of experts (:mod:`epochal.model.layers.router`).
The tensors, in the checkpoints' per-expert layout (what ``save_pretrained`` writes)::

    model.layers.L.mlp.gate.weight                        <-> layers.L.mlp.router.weight
    model.layers.L.mlp.gate.e_score_correction_bias       <-> layers.L.mlp.expert_bias
    model.layers.L.mlp.experts.E.gate/up/down_proj        <-> layers.L.mlp.experts.E.w1/w3/w2
    model.layers.L.mlp.shared_experts.gate/up/down_proj   <-> layers.L.mlp.shared_expert.w1/w3/w2
    model.layers.L.mlp.gate/up/down_proj (dense blocks)   <-> layers.L.mlp.w1/w3/w2

Configuration::

    n_routed_experts, num_experts_per_tok        <-> num_experts, moe_router_topk
    moe_intermediate_size                        <-> moe_ffn_hidden_size
    n_shared_experts * moe_intermediate_size     <-> moe_shared_expert_intermediate_size (no gate)
    first_k_dense_replace                        <-> moe_layer_freq = [0] * k + [1] * (L - k)
    n_group, topk_group (> 1 group)              <-> moe_router_num_groups, moe_router_group_topk
    routed_scaling_factor                        <-> moe_router_topk_scaling_factor
    (always)                                     <-> moe_router_score_function = "sigmoid",
                                                     moe_router_enable_expert_bias
    partial_rotary_factor                        <-> rotary_percent
    attention_bias, use_qk_norm                  <-> add_qkv_bias, qk_layernorm

Refused by name: ``norm_topk_prob=false`` (epochal renormalises the chosen sigmoid scores
when ``k > 1``, as Megatron-Core), and a group limit whose group score differs from
ours (transformers sums each group's top two scores, epochal its top
``num_experts_per_tok / topk_group``, Megatron-Core's rule: the same when that is 2).
Multi-token-prediction layers (``num_nextn_predict_layers``) are not part of
transformers' model; their tensors, if a checkpoint holds them, are refused as unexpected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.llama import (
    decoder_config,
    decoder_export_problems,
    decoder_json,
    decoder_state_from_ours,
    decoder_state_to_ours,
)
from epochal.formats.hf.moe import moe_module_from_ours, moe_module_to_ours
from epochal.model.config import ModelConfig
from epochal.model.moe_options import moe_layer_pattern

__all__ = [
    "glm4_moe_config_from_ours",
    "glm4_moe_state_from_ours",
    "ours_config_from_glm4_moe",
    "ours_state_from_glm4_moe",
]

_BIAS_OURS = "mlp.expert_bias"


def ours_config_from_glm4_moe(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` from a ``Glm4MoeForCausalLM`` ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly (named).
    """
    if not hf.get("norm_topk_prob", True):
        raise ConversionError(
            "config.json: norm_topk_prob=false is not supported (epochal renormalises the "
            "chosen sigmoid scores when num_experts_per_tok > 1, as Megatron-Core)"
        )
    layers, k = int(hf["num_hidden_layers"]), int(hf.get("num_experts_per_tok", 8))
    dense = int(hf.get("first_k_dense_replace", 1) or 0)
    if dense >= layers:
        raise ConversionError(
            f"config.json: first_k_dense_replace={dense} leaves no mixture-of-experts layer of "
            f"num_hidden_layers={layers} (convert it as a dense model)"
        )
    groups, group_topk = int(hf.get("n_group", 1) or 1), int(hf.get("topk_group", 1) or 1)
    if groups > 1 and k // group_topk != 2:
        raise ConversionError(
            f"config.json: n_group={groups}, topk_group={group_topk} with num_experts_per_tok={k}: "
            "transformers scores a group by its top two experts, epochal by its top "
            f"num_experts_per_tok / topk_group = {k // group_topk} (Megatron-Core's rule)"
        )
    scale = float(hf.get("routed_scaling_factor", 1.0) or 1.0)
    width = int(hf["moe_intermediate_size"])
    shared = int(hf.get("n_shared_experts", 0) or 0) * width
    moe = dict(
        num_experts=int(hf["n_routed_experts"]),
        moe_router_topk=k,
        moe_ffn_hidden_size=width,
        moe_shared_expert_intermediate_size=shared or None,
        moe_layer_freq=1 if dense == 0 else [0] * dense + [1] * (layers - dense),
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_num_groups=groups if groups > 1 else None,
        moe_router_group_topk=group_topk if groups > 1 else None,
        moe_router_topk_scaling_factor=None if scale == 1.0 else scale,
    )
    return decoder_config(
        hf,
        family="GLM-4.5",
        add_bias_linear=False,
        add_qkv_bias=bool(hf.get("attention_bias", False)),
        qk_layernorm=bool(hf.get("use_qk_norm", False)),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        moe=moe,
        partial_rotary=True,
    )


def ours_state_from_glm4_moe(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str
) -> dict[str, torch.Tensor]:
    """A GLM-4.5 state dict in our names (:func:`~epochal.formats.hf.llama.decoder_state_to_ours`).

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    rest, biases = {}, {}
    for name, tensor in hf_state.items():  # the bias is the gate's buffer, ours the layer's
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias", name)
        if m:
            biases[f"layers.{m[1]}.{_BIAS_OURS}"] = tensor
        else:
            rest[name] = tensor
    return decoder_state_to_ours(
        rest, config, source=source, moe_module=moe_module_to_ours("glm4_moe"), extra=biases
    )


def glm4_moe_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Our state dict in GLM-4.5's names (validated by :func:`glm4_moe_config_from_ours`)."""
    glm4_moe_config_from_ours(config)
    biases = {n: t for n, t in state.items() if n.endswith(f".{_BIAS_OURS}")}
    rest = {n: t for n, t in state.items() if n not in biases}
    out = decoder_state_from_ours(rest, config, moe_module_from_ours("glm4_moe"))
    for name, tensor in biases.items():
        layer = name.split(".")[1]
        out[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = tensor
    return out


def glm4_moe_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A ``Glm4MoeForCausalLM`` ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not such a model (every difference named).
    """
    problems = decoder_export_problems(config, moe=True, partial_rotary=True)
    if config.num_experts is None:
        problems.append("num_experts is not set (a dense model; GLM-4.5 is a mixture of experts)")
        raise ConversionError("cannot export to GLM-4.5: " + "; ".join(problems))
    pattern = moe_layer_pattern(config.moe_layer_freq, config.num_layers)
    dense = pattern.index(True)
    wanted = (
        ("moe_router_score_function", config.moe_router_score_function, "sigmoid"),
        ("moe_router_enable_expert_bias", config.moe_router_enable_expert_bias, True),
        ("moe_shared_expert_gate", config.moe_shared_expert_gate, False),
        ("add_bias_linear", config.add_bias_linear, False),
        ("moe_layer_freq", all(pattern[dense:]), True),
    )
    for name, value, needed in wanted:
        if value != needed:
            shown = config.moe_layer_freq if name == "moe_layer_freq" else value
            problems.append(f"{name}={shown!r} (GLM-4.5 needs {needed!r} there)")
    shared = config.moe_shared_expert_intermediate_size or 0
    if shared % config.moe_ffn_size:
        problems.append(
            f"moe_shared_expert_intermediate_size={shared} (GLM-4.5's shared experts are "
            f"n_shared_experts x moe_ffn_hidden_size={config.moe_ffn_size} wide)"
        )
    groups = config.moe_router_num_groups
    if groups is not None and config.moe_router_topk // config.moe_router_group_topk != 2:
        problems.append(
            f"moe_router_group_topk={config.moe_router_group_topk} (transformers scores a group "
            f"by its top two experts: needs moe_router_topk / group_topk = 2)"
        )
    if problems:
        raise ConversionError("cannot export to GLM-4.5: " + "; ".join(problems))
    out = decoder_json(
        config, architecture="Glm4MoeForCausalLM", model_type="glm4_moe", dtype=dtype
    )
    out.update(
        attention_bias=config.qkv_bias,
        use_qk_norm=config.qk_layernorm,
        n_routed_experts=config.num_experts,
        num_experts_per_tok=config.moe_router_topk,
        moe_intermediate_size=config.moe_ffn_size,
        n_shared_experts=shared // config.moe_ffn_size,
        first_k_dense_replace=dense,
        n_group=groups or 1,
        topk_group=config.moe_router_group_topk or 1,
        routed_scaling_factor=config.moe_router_topk_scaling_factor or 1.0,
        norm_topk_prob=True,
        num_nextn_predict_layers=0,
    )
    return out
