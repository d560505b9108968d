"""Hugging Face ``GPT2LMHeadModel`` <-> epochal ``GPTModel``.

Mapping (``L`` = layer index; HF names may lack the ``transformer.`` prefix, as in
the original ``gpt2`` checkpoints)::

    transformer.wte.weight            [V, h]   <-> tok_embeddings.weight  (rows padded / cut)
    transformer.wpe.weight            [P, h]   <-> pos_embeddings.weight
    transformer.h.L.ln_1.{weight,bias}         <-> layers.L.attention_norm.*
    transformer.h.L.attn.c_attn.weight [h, 3h] <-> cat(wq, wk, wv).T   (Conv1D stores [in, out])
    transformer.h.L.attn.c_attn.bias   [3h]    <-> cat(bq, bk, bv)
    transformer.h.L.attn.c_proj.weight [h, h]  <-> layers.L.attention.wo.weight.T
    transformer.h.L.ln_2.*                     <-> layers.L.ffn_norm.*
    transformer.h.L.mlp.c_fc.weight   [h, f]   <-> layers.L.mlp.fc1.weight.T
    transformer.h.L.mlp.c_proj.weight [f, h]   <-> layers.L.mlp.fc2.weight.T
    transformer.ln_f.*                         <-> norm.*
    lm_head.weight                    [V, h]   <-> output.weight (only when untied)

Configuration: ``activation_function`` ``gelu_new``/``gelu_pytorch_tanh`` ->
``gelu_tanh``, ``gelu`` -> ``gelu``; ``resid_pdrop`` -> ``hidden_dropout`` (our
model has one dropout for embeddings and residuals; ``embd_pdrop`` is dropped on
import and written equal to ``resid_pdrop`` on export); ``attn_pdrop`` ->
``attention_dropout``. GPT-2 options our model does not implement
(``scale_attn_by_inverse_layer_idx``, ``scale_attn_weights=False``, cross
attention) are refused with :class:`ConversionError`. The vocabulary is padded
with zero rows to a multiple of ``make_vocab_size_divisible_by`` on import and
cut back to ``vocab_size`` on export. Causal-mask buffers (``attn.bias``,
``attn.masked_bias``) of old checkpoints are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    "gpt2_config_from_ours",
    "gpt2_state_from_ours",
    "ours_config_from_gpt2",
    "ours_state_from_gpt2",
]

_ACTIVATIONS_IN = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_ACTIVATIONS_OUT = {"gelu_tanh": "gelu_new", "gelu": "gelu"}
_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def ours_config_from_gpt2(
    hf: Mapping[str, Any], *, make_vocab_size_divisible_by: int = 128
) -> ModelConfig:
    """Build our :class:`ModelConfig` from a GPT-2 ``config.json`` dict.

    Raises:
        ConversionError: an option our model cannot reproduce exactly.
    """
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS_IN:
        raise ConversionError(
            f"config.json: activation_function={act!r} is not supported (use one of {sorted(_ACTIVATIONS_IN)})"
        )
    for key, bad in (
        ("scale_attn_by_inverse_layer_idx", True),
        ("scale_attn_weights", False),
        ("add_cross_attention", True),
    ):
        if hf.get(key, not bad) == bad:
            raise ConversionError(
                f"config.json: {key}={bad} is not supported by epochal's GPTModel"
            )
    n_embd = int(hf["n_embd"])
    config = ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        hidden_size=n_embd,
        num_layers=int(hf["n_layer"]),
        num_attention_heads=int(hf["n_head"]),
        ffn_hidden_size=int(hf["n_inner"]) if hf.get("n_inner") else 4 * n_embd,
        max_position_embeddings=int(hf["n_positions"]),
        position_embedding_type="learned_absolute",
        normalization="LayerNorm",
        norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=_ACTIVATIONS_IN[act],
        add_bias_linear=True,
        add_qkv_bias=None,
        untie_embeddings_and_output_weights=not hf.get("tie_word_embeddings", True),
        hidden_dropout=float(hf.get("resid_pdrop", 0.1)),
        attention_dropout=float(hf.get("attn_pdrop", 0.1)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
    )
    return normalize_config(config)


def gpt2_config_from_ours(
    config: ModelConfig, *, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """A GPT-2 ``config.json`` dict for ``config``.

    Raises:
        ConversionError: ``config`` uses something GPT-2 does not have (RoPE/ALiBi,
            RMSNorm, SwiGLU, grouped-query attention, no biases, a custom head size).
    """
    problems = []
    if config.position_embedding_type != "learned_absolute":
        problems.append(
            f"position_embedding_type={config.position_embedding_type!r} (needs learned_absolute)"
        )
    if config.normalization != "LayerNorm":
        problems.append(f"normalization={config.normalization!r} (needs LayerNorm)")
    if config.activation not in _ACTIVATIONS_OUT:
        problems.append(f"activation={config.activation!r} (needs gelu or gelu_tanh)")
    if config.num_kv_heads != config.num_attention_heads:
        problems.append(
            f"num_query_groups={config.num_query_groups} (GPT-2 has multi-head attention only)"
        )
    if config.head_dim * config.num_attention_heads != config.hidden_size:
        problems.append(f"kv_channels={config.kv_channels} (GPT-2 needs hidden_size / heads)")
    if not (config.add_bias_linear and config.qkv_bias):
        problems.append("add_bias_linear/add_qkv_bias=False (GPT-2 has biases everywhere)")
    if problems:
        raise ConversionError("cannot export to GPT-2: " + "; ".join(problems))
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.max_position_embeddings,
        "n_embd": config.hidden_size,
        "n_layer": config.num_layers,
        "n_head": config.num_attention_heads,
        "n_inner": config.ffn_size,
        "activation_function": _ACTIVATIONS_OUT[config.activation],
        "layer_norm_epsilon": config.norm_epsilon,
        "resid_pdrop": config.hidden_dropout,
        "embd_pdrop": config.hidden_dropout,
        "attn_pdrop": config.attention_dropout,
        "initializer_range": config.init_method_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": None,
        "eos_token_id": None,
        "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _strip_prefix(hf_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in hf_state.items():
        if name.endswith(_BUFFER_SUFFIXES):
            continue
        if name.startswith("transformer."):
            name = name[len("transformer.") :]
        out[name] = tensor
    return out


def ours_state_from_gpt2(
    hf_state: Mapping[str, torch.Tensor], config: ModelConfig, *, source: str = "GPT-2 checkpoint"
) -> dict[str, torch.Tensor]:
    """Convert a GPT-2 state dict to our parameter names (vocabulary padded with zeros).

    Conv1D weights come back as transposed *views* (``[out, in]`` strides over the
    ``[in, out]`` storage): ``load_state_dict`` / ``copy_`` / saving make them
    contiguous once, where needed, instead of here.

    Raises:
        ConversionError: a tensor is missing, unexpected or has the wrong shape.
    """
    hf = _strip_prefix(hf_state)
    out: dict[str, torch.Tensor] = {}

    def take(name: str) -> torch.Tensor:
        try:
            return hf.pop(name)
        except KeyError:
            raise ConversionError(f"{source}: missing tensor {name!r}") from None

    h = config.hidden_size
    out["tok_embeddings.weight"] = resize_rows(take("wte.weight"), config.padded_vocab_size)
    out["pos_embeddings.weight"] = take("wpe.weight")
    for i in range(config.num_layers):
        src, dst = f"h.{i}.", f"layers.{i}."
        for norm_in, norm_out in (("ln_1", "attention_norm"), ("ln_2", "ffn_norm")):
            out[f"{dst}{norm_out}.weight"] = take(f"{src}{norm_in}.weight")
            out[f"{dst}{norm_out}.bias"] = take(f"{src}{norm_in}.bias")
        qkv_w = take(f"{src}attn.c_attn.weight").t()  # [3h, h]
        qkv_b = take(f"{src}attn.c_attn.bias")
        if qkv_w.shape[0] != 3 * h:
            raise ConversionError(
                f"{source}: {src}attn.c_attn.weight has shape {tuple(qkv_w.shape[::-1])}"
            )
        for j, proj in enumerate(("wq", "wk", "wv")):
            out[f"{dst}attention.{proj}.weight"] = qkv_w[j * h : (j + 1) * h]
            out[f"{dst}attention.{proj}.bias"] = qkv_b[j * h : (j + 1) * h].clone()
        out[f"{dst}attention.wo.weight"] = take(f"{src}attn.c_proj.weight").t()
        out[f"{dst}attention.wo.bias"] = take(f"{src}attn.c_proj.bias")
        out[f"{dst}mlp.fc1.weight"] = take(f"{src}mlp.c_fc.weight").t()
        out[f"{dst}mlp.fc1.bias"] = take(f"{src}mlp.c_fc.bias")
        out[f"{dst}mlp.fc2.weight"] = take(f"{src}mlp.c_proj.weight").t()
        out[f"{dst}mlp.fc2.bias"] = take(f"{src}mlp.c_proj.bias")
    out["norm.weight"] = take("ln_f.weight")
    out["norm.bias"] = take("ln_f.bias")
    head = hf.pop("lm_head.weight", None)
    out = attach_output_head(config, out, head, source=source, head_name="lm_head.weight")
    if hf:
        raise ConversionError(f"{source}: unexpected tensors {sorted(hf)[:8]}")
    check_shapes(out, config, source)
    return out


def gpt2_state_from_ours(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Convert our state dict to GPT-2 names (``transformer.`` prefix; vocabulary cut to ``vocab_size``).

    Tied models get no ``lm_head.weight`` (Hugging Face re-ties it on load).
    """
    gpt2_config_from_ours(config)  # validates
    v = config.vocab_size
    out: dict[str, torch.Tensor] = {
        "transformer.wte.weight": state["tok_embeddings.weight"][:v].contiguous(),
        "transformer.wpe.weight": state["pos_embeddings.weight"].contiguous(),
    }
    for i in range(config.num_layers):
        src, dst = f"layers.{i}.", f"transformer.h.{i}."
        for norm_in, norm_out in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
            out[f"{dst}{norm_out}.weight"] = state[f"{src}{norm_in}.weight"]
            out[f"{dst}{norm_out}.bias"] = state[f"{src}{norm_in}.bias"]
        qkv = torch.cat([state[f"{src}attention.{p}.weight"] for p in ("wq", "wk", "wv")], dim=0)
        out[f"{dst}attn.c_attn.weight"] = qkv.t().contiguous()
        out[f"{dst}attn.c_attn.bias"] = torch.cat(
            [state[f"{src}attention.{p}.bias"] for p in ("wq", "wk", "wv")]
        )
        out[f"{dst}attn.c_proj.weight"] = state[f"{src}attention.wo.weight"].t().contiguous()
        out[f"{dst}attn.c_proj.bias"] = state[f"{src}attention.wo.bias"]
        out[f"{dst}mlp.c_fc.weight"] = state[f"{src}mlp.fc1.weight"].t().contiguous()
        out[f"{dst}mlp.c_fc.bias"] = state[f"{src}mlp.fc1.bias"]
        out[f"{dst}mlp.c_proj.weight"] = state[f"{src}mlp.fc2.weight"].t().contiguous()
        out[f"{dst}mlp.c_proj.bias"] = state[f"{src}mlp.fc2.bias"]
    out["transformer.ln_f.weight"] = state["norm.weight"]
    out["transformer.ln_f.bias"] = state["norm.bias"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["output.weight"][:v].contiguous()
    return out
