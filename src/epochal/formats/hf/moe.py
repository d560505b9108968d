"""Hugging Face ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM`` <-> ``GPTModel``.

The three are Llama-shaped decoders (:mod:`epochal.formats.hf.llama`: attention,
norms, embeddings and RoPE read and written by the shared functions) whose MLP is a
mixture of experts (:mod:`epochal.model.layers.moe`). The MoE tensors, in the
checkpoints' per-expert layout (what ``save_pretrained`` writes)::

    Mixtral:   model.layers.L.block_sparse_moe.gate.weight          <-> layers.L.mlp.router.weight
               model.layers.L.block_sparse_moe.experts.E.w1/w3/w2   <-> layers.L.mlp.experts.E.w1/w3/w2
    Qwen-MoE:  model.layers.L.mlp.gate.weight                       <-> layers.L.mlp.router.weight
               model.layers.L.mlp.experts.E.gate/up/down_proj       <-> layers.L.mlp.experts.E.w1/w3/w2
               model.layers.L.mlp.shared_expert.gate/up/down_proj   <-> layers.L.mlp.shared_expert.w1/w3/w2
               model.layers.L.mlp.shared_expert_gate.weight         <-> layers.L.mlp.shared_expert_gate.weight

Configuration::

    num_local_experts / num_experts (Qwen)       <-> num_experts
    num_experts_per_tok                          <-> moe_router_topk
    intermediate_size (Mixtral: the experts')    <-> ffn_hidden_size (and moe_ffn_hidden_size, Mixtral)
    moe_intermediate_size (Qwen)                 <-> moe_ffn_hidden_size
    shared_expert_intermediate_size (Qwen2-MoE)  <-> moe_shared_expert_intermediate_size (gate on)
    norm_topk_prob (Qwen; Mixtral always)        <-> not moe_router_pre_softmax
    decoder_sparse_step, mlp_only_layers (Qwen)  <-> moe_layer_freq (a list when not every block)
    router_aux_loss_coef                         <-> moe_aux_loss_coeff

``router_aux_loss_coef`` carries over as the coefficient; transformers' balance loss
(computed only with ``output_router_logits``) is ``moe_router_topk`` times Megatron's
per-layer form epochal uses, and averages the layers where Megatron sums them.
Hugging Face's MoE has no capacity: an exported model routes dropless, whatever
``moe_expert_capacity_factor`` it trained with. Mixtral's ``router_jitter_noise``
(multiplicative noise in training) is refused when non-zero.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from epochal.formats.common import ConversionError
from epochal.formats.hf.llama import decoder_config, decoder_export_problems, decoder_json
from epochal.formats.hf.qwen2 import layer_window, qwen_window_json
from epochal.model.config import ModelConfig
from epochal.model.moe_options import moe_layer_pattern

__all__ = [
    "MOE_FAMILIES",
    "moe_config_from_ours",
    "moe_module_from_ours",
    "moe_module_to_ours",
    "ours_config_from_moe",
]

#: model_type -> (architecture, family name for messages)
MOE_FAMILIES = {
    "mixtral": ("MixtralForCausalLM", "Mixtral"),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2-MoE"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3-MoE"),
}
_QWEN_PROJ = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


#: Per family: (HF router module, HF experts prefix, HF projection -> ours, HF shared-expert prefix).
_MOE_MODULES = {
    "mixtral": (
        "block_sparse_moe.gate",
        "block_sparse_moe.experts",
        {"w1": "w1", "w2": "w2", "w3": "w3"},
        None,
    ),
    "qwen": ("mlp.gate", "mlp.experts", _QWEN_PROJ, "mlp.shared_expert"),
    "glm4_moe": ("mlp.gate", "mlp.experts", _QWEN_PROJ, "mlp.shared_experts"),  # GLM-4.5
}


def _moe_module_map(model_type: str, *, to_ours: bool) -> Callable[[str], str | None]:
    """One direction of the MoE module-path mapping of ``model_type`` (None: not an MoE tensor)."""
    router, experts, proj, shared = _MOE_MODULES.get(model_type, _MOE_MODULES["qwen"])
    if to_ours:
        src_router, dst_router, src_experts, dst_experts = (
            router,
            "mlp.router",
            experts,
            "mlp.experts",
        )
    else:
        src_router, dst_router, src_experts, dst_experts = (
            "mlp.router",
            router,
            "mlp.experts",
            experts,
        )
        proj = {ours: theirs for theirs, ours in proj.items()}

    def convert(module: str) -> str | None:
        if module == src_router:
            return dst_router
        if shared is not None and module == "mlp.shared_expert_gate":
            return module
        m = re.fullmatch(rf"{re.escape(src_experts)}\.(\d+)\.(\w+)", module)
        if m and m[2] in proj:
            return f"{dst_experts}.{m[1]}.{proj[m[2]]}"
        if shared is not None:
            src_shared, dst_shared = (shared, "mlp.shared_expert")[:: 1 if to_ours else -1]
            m = re.fullmatch(rf"{re.escape(src_shared)}\.(\w+)", module)
            if m and m[1] in proj:
                return f"{dst_shared}.{proj[m[1]]}"
        return None

    return convert


def moe_module_to_ours(model_type: str) -> Callable[[str], str | None]:
    """``module path inside a HF layer -> ours`` for the MoE tensors of ``model_type`` (None: not MoE)."""
    return _moe_module_map(model_type, to_ours=True)


def moe_module_from_ours(model_type: str) -> Callable[[str], str | None]:
    """``our module path inside a layer -> HF`` for the MoE tensors (None: not MoE)."""
    return _moe_module_map(model_type, to_ours=False)


def _qwen_layer_freq(hf: Mapping[str, Any], layers: int) -> int | list[int]:
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    dense = set(hf.get("mlp_only_layers") or [])
    pattern = [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
    if not any(pattern):
        raise ConversionError(
            f"config.json: decoder_sparse_step={step}, mlp_only_layers={sorted(dense)} leave no "
            "mixture-of-experts layer (convert it as a dense model)"
        )
    return 1 if all(pattern) else pattern


def ours_config_from_moe(
    hf: Mapping[str, Any], model_type: str, *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Our :class:`ModelConfig` from a Mixtral / Qwen2-MoE / Qwen3-MoE ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly (named).
    """
    family = MOE_FAMILIES[model_type][1]
    layers = int(hf["num_hidden_layers"])
    coeff = float(hf.get("router_aux_loss_coef", 0.0) or 0.0)
    moe: dict[str, Any] = {"moe_router_topk": int(hf.get("num_experts_per_tok", 2))}
    extra: dict[str, Any] = {}
    if model_type == "mixtral":
        if float(hf.get("router_jitter_noise", 0.0) or 0.0) != 0.0:
            raise ConversionError(
                "config.json: router_jitter_noise != 0 is not supported (Mixtral's training-time "
                "noise on the router input)"
            )
        window = hf.get("sliding_window")
        extra = dict(add_bias_linear=False, add_qkv_bias=False, sliding_window=window)
        moe.update(
            num_experts=int(hf.get("num_local_experts", 8)),
            moe_ffn_hidden_size=int(hf["intermediate_size"]),
        )
    else:
        if model_type == "qwen3_moe" and hf.get("attention_bias", False):
            raise ConversionError(
                "config.json: attention_bias=True is not supported for Qwen3-MoE (biases on q, k, "
                "v and o_proj)"
            )
        qkv_bias = bool(hf.get("qkv_bias", True)) if model_type == "qwen2_moe" else False
        extra = dict(
            add_bias_linear=False,
            add_qkv_bias=qkv_bias,
            qk_layernorm=model_type == "qwen3_moe",
            sliding_window=layer_window(hf),
            default_head_dim=128 if model_type == "qwen3_moe" else None,
        )
        shared = int(hf.get("shared_expert_intermediate_size", 0) or 0)
        experts = hf.get("num_experts", hf.get("num_local_experts"))
        if experts is None:
            raise ConversionError("config.json: num_experts is missing (the number of experts)")
        moe.update(
            num_experts=int(experts),
            moe_ffn_hidden_size=int(hf["moe_intermediate_size"]),
            moe_router_pre_softmax=not bool(hf.get("norm_topk_prob", False)),
            moe_layer_freq=_qwen_layer_freq(hf, layers),
        )
        if model_type == "qwen2_moe" and shared > 0:
            moe.update(moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=True)
    return decoder_config(
        hf,
        family=family,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        moe={**moe, "moe_aux_loss_coeff": coeff},
        **extra,
    )


def moe_config_from_ours(
    config: ModelConfig, model_type: str, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A Mixtral / Qwen2-MoE / Qwen3-MoE ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` is not such a model (every difference named).
    """
    architecture, family = MOE_FAMILIES[model_type]
    problems = decoder_export_problems(config, moe=True)
    if config.num_experts is None:
        problems.append(f"num_experts is not set (a dense model; {family} is a mixture of experts)")
        raise ConversionError(f"cannot export to {family}: " + "; ".join(problems))
    pattern = moe_layer_pattern(config.moe_layer_freq, config.num_layers)
    qwen3 = model_type == "qwen3_moe"
    if config.qk_layernorm != qwen3:
        problems.append(
            f"qk_layernorm={config.qk_layernorm} ({family} {'needs' if qwen3 else 'has no'} QK-norm)"
        )
    if config.add_bias_linear or (config.qkv_bias and model_type != "qwen2_moe"):
        problems.append(
            f"add_qkv_bias={config.qkv_bias}, add_bias_linear={config.add_bias_linear} "
            f"({family} has {'biases on q, k and v only' if model_type == 'qwen2_moe' else 'no biases'})"
        )
    shared = config.moe_shared_expert_intermediate_size
    if model_type == "qwen2_moe":
        if shared is None:
            problems.append(
                "moe_shared_expert_intermediate_size is not set (Qwen2-MoE has a shared expert)"
            )
        elif not config.moe_shared_expert_gate:
            problems.append(
                "moe_shared_expert_gate=False (Qwen2-MoE gates its shared expert by "
                "sigmoid(shared_expert_gate(x)))"
            )
    elif shared is not None:
        problems.append(
            f"moe_shared_expert_intermediate_size={shared} (a shared expert; {family} has none)"
        )
    routing = [
        f"{name}={value!r}"
        for name, value, plain in (
            ("moe_router_score_function", config.moe_router_score_function, "softmax"),
            ("moe_router_enable_expert_bias", config.moe_router_enable_expert_bias, False),
            ("moe_router_num_groups", config.moe_router_num_groups, None),
            ("moe_router_topk_scaling_factor", config.moe_router_topk_scaling_factor, None),
        )
        if value != plain
    ]
    if routing:
        problems.append(f"{', '.join(routing)} ({family} routes by a plain softmax top-k)")
    if model_type == "mixtral":
        if config.moe_router_pre_softmax:
            problems.append("moe_router_pre_softmax=True (Mixtral renormalises the top-k)")
        if not all(pattern):
            problems.append(
                f"moe_layer_freq={config.moe_layer_freq!r} (every Mixtral layer is MoE)"
            )
    if problems:
        raise ConversionError(f"cannot export to {family}: " + "; ".join(problems))
    out = {
        **decoder_json(config, architecture=architecture, model_type=model_type, dtype=dtype),
        "num_experts_per_tok": config.moe_router_topk,
        "router_aux_loss_coef": config.moe_aux_loss_coeff,
        "output_router_logits": False,
    }
    if model_type == "mixtral":
        out.update(
            num_local_experts=config.num_experts,
            intermediate_size=config.moe_ffn_size,
            sliding_window=config.sliding_window,
            router_jitter_noise=0.0,
        )
        return out
    out.update(
        num_experts=config.num_experts,
        moe_intermediate_size=config.moe_ffn_size,
        norm_topk_prob=not config.moe_router_pre_softmax,
        decoder_sparse_step=1,
        mlp_only_layers=[i for i, sparse in enumerate(pattern) if not sparse],
        **qwen_window_json(config),
    )
    if model_type == "qwen2_moe":
        out.update(shared_expert_intermediate_size=shared, qkv_bias=config.qkv_bias)
    else:
        out["attention_bias"] = False
    return out
