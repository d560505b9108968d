"""Megatron-Core mixture-of-experts layers in checkpoints: arguments, expert layouts, expert parallelism.

Tensors of an MoE block (Megatron-Core ``MoELayer``, local or Transformer-Engine spec),
whole and with *global* expert indices ``e`` as the rest of the converter sees them::

    decoder.layers.L.mlp.router.weight                             [E, hidden]
    decoder.layers.L.mlp.experts.local_experts.e.linear_fc1.weight  [2 f, hidden] (SwiGLU: [gate; up])
    decoder.layers.L.mlp.experts.local_experts.e.linear_fc2.weight  [hidden, f]
    decoder.layers.L.mlp.shared_experts.linear_fc1 / linear_fc2     the shared expert (optional)
    decoder.layers.L.mlp.shared_experts.gate_weight                 [1, hidden] (--moe-shared-expert-gate)

ours: ``layers.L.mlp.router``, ``mlp.experts.e.w1/w3/w2`` (or ``fc1/fc2``),
``mlp.shared_expert.*``, ``mlp.shared_expert_gate.weight``
(:mod:`epochal.model.layers.moe`). The MoE block's pre-MLP norm is
``pre_mlp_layernorm`` in both specs (Transformer Engine does not fuse it into the
experts), so Transformer-Engine exports keep that name on MoE blocks.

Legacy files (``--ckpt-format torch``) hold one file per tensor x pipeline x
expert-parallel rank, named as Megatron-LM's ``get_checkpoint_name`` does::

    mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]     (the pipeline part only when PP > 1,
                                                 the expert part only when EP > 1)

so ``mp_rank_00_001`` is pipeline rank 1 or expert rank 1: ``args``
(``pipeline_model_parallel_size``, ``expert_model_parallel_size``) decide. Expert rank
``r`` holds experts ``r * E/EP .. (r+1) * E/EP - 1`` under their *local* indices
(``local_experts.0 ..``) and a copy of every other tensor (checked equal on import).
Experts are tensor-parallel like the dense MLP (``expert_tensor_parallel_size`` = TP;
other values are refused). Megatron's ``GroupedMLP`` (``--moe-grouped-gemm``) stores a
rank's local experts as ``mlp.experts.weight1`` ``[hidden, E_local * fc1 rows]`` and
``weight2`` ``[E_local * f, hidden]``, read as ``GroupedMLP.forward`` does
(``weight1.view(E_local, hidden, -1)[i]`` is expert ``i``'s transposed ``linear_fc1``);
:func:`grouped_to_sequential` rewrites them as sequential experts on import. Exports
write sequential experts (``--moe-grouped-gemm`` off, Megatron-LM's default).

``torch_dist`` (layout-free): each block's experts are one tensor
``mlp.experts.experts.linear_fc1.weight`` ``[E, 2 f, hidden]`` (GroupedMLP and
SequentialMLP save the same), under the usual leading layer dimension when every block
is alike (``moe_layer_freq=1``); with dense blocks between (``moe_layer_freq`` > 1 or a
list) Megatron keys every block apart (``decoder.layers.{i}.*``, no layer dimension).
The local spec saves an MoE block's pre-MLP norm as ``mlp.linear_fc1.layer_norm_weight``,
the Transformer-Engine spec as ``pre_mlp_layernorm.weight``: exports follow
``--megatron-spec``; imports read both.

Arguments (Megatron-LM's names = ours; :func:`moe_args_from_config`,
:func:`moe_fields_from_args`): ``num_experts``, ``moe_router_topk``,
``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``,
``moe_shared_expert_gate``, ``moe_router_pre_softmax`` (softmax over all experts,
top-k kept unnormalised: Qwen2-MoE's ``norm_topk_prob=False``; off: softmax over the
top-k logits = renormalised), ``moe_aux_loss_coeff``, ``moe_z_loss_coeff``,
``moe_expert_capacity_factor`` (``moe_token_drop_policy="probs"``), ``moe_layer_freq``,
and DeepSeek-V3's routing: ``moe_router_score_function`` (``softmax``, ``sigmoid``),
``moe_router_enable_expert_bias`` with ``moe_router_bias_update_rate`` (the bias itself is
the router's ``expert_bias`` tensor, ours ``mlp.expert_bias``), ``moe_router_num_groups``
/ ``moe_router_group_topk``, ``moe_router_topk_scaling_factor``.
Routing epochal does not build is refused by name on import:
``moe_input_jitter_eps``, ``moe_router_load_balancing_type="sinkhorn"`` (and
``global_aux_loss``, and several kinds at once),
``moe_token_drop_policy="position"``, ``moe_latent_size``. The balance loss's kind
(``moe_router_load_balancing_type``: ``aux_loss``, ``seq_aux_loss``, ``none``) is ours.
"""

from __future__ import annotations

import re
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

import torch

from epochal.formats.common import ConversionError

__all__ = [
    "experts_from_dist",
    "experts_to_dist",
    "grouped_to_sequential",
    "merge_expert_ranks",
    "moe_args_from_config",
    "moe_fields_from_args",
    "split_expert_ranks",
]

_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)(\..*)$")


def _get(args: Namespace, name: str, default: Any = None) -> Any:
    value = getattr(args, name, default)
    return default if value is None else value


# ----------------------------------------------------------------------------- arguments
def moe_args_from_config(config: Any, *, tensor_parallel: int, expert_parallel: int) -> dict:
    """The MoE part of the exported ``args`` (dense models: ``num_experts=None``).

    Raises:
        ConversionError: ``expert_parallel`` does not divide ``num_experts``.
    """
    n = config.num_experts
    if n is None:
        if expert_parallel != 1:
            raise ConversionError(
                f"--expert-parallel {expert_parallel}: the model has no experts (num_experts "
                "is not set); write it with --expert-parallel 1"
            )
        return {"num_experts": None, "expert_model_parallel_size": 1}
    if expert_parallel < 1 or n % expert_parallel:
        raise ConversionError(
            f"--expert-parallel {expert_parallel} must be >= 1 and divide num_experts={n}"
        )
    freq = config.moe_layer_freq
    return {
        "num_experts": n,
        "moe_router_topk": config.moe_router_topk,
        "moe_ffn_hidden_size": config.moe_ffn_size,
        "moe_shared_expert_intermediate_size": config.moe_shared_expert_intermediate_size,
        "moe_shared_expert_gate": config.moe_shared_expert_gate,
        "moe_router_pre_softmax": config.moe_router_pre_softmax,
        "moe_router_score_function": config.moe_router_score_function,
        "moe_router_topk_scaling_factor": config.moe_router_topk_scaling_factor,
        "moe_router_enable_expert_bias": config.moe_router_enable_expert_bias,
        "moe_router_bias_update_rate": config.moe_router_bias_update_rate,
        "moe_router_num_groups": config.moe_router_num_groups,
        "moe_router_group_topk": config.moe_router_group_topk,
        "moe_router_load_balancing_type": config.moe_router_load_balancing_type,
        "moe_aux_loss_coeff": config.moe_aux_loss_coeff,
        "moe_z_loss_coeff": config.moe_z_loss_coeff or None,
        "moe_expert_capacity_factor": config.moe_expert_capacity_factor,
        "moe_token_drop_policy": "probs",
        "moe_pad_expert_input_to_capacity": False,
        "moe_layer_freq": list(freq) if isinstance(freq, list | tuple) else freq,
        "moe_grouped_gemm": False,  # the experts are written sequential (local_experts.e)
        "expert_model_parallel_size": expert_parallel,
        "expert_tensor_parallel_size": tensor_parallel,
    }


def _refuse(source: str, name: str, value: Any, why: str) -> ConversionError:
    return ConversionError(f"{source}: args.{name}={value!r} is not supported ({why})")


def moe_fields_from_args(args: Namespace, source: str) -> dict[str, Any]:
    """Our ``ModelConfig`` MoE fields from Megatron ``args`` (empty for a dense model).

    Raises:
        ConversionError: routing or layers epochal does not build (named; see the module docstring).
    """
    n = _get(args, "num_experts")
    if not n:
        return {}
    score = _get(args, "moe_router_score_function", "softmax")
    if score not in ("softmax", "sigmoid"):
        raise _refuse(source, "moe_router_score_function", score, "softmax and sigmoid are built")
    for name, why in (
        ("moe_input_jitter_eps", "no router input jitter in epochal"),
        ("moe_latent_size", "no latent expert projection in epochal"),
    ):
        value = _get(args, name)
        if value not in (None, False, 0, 0.0):
            raise _refuse(source, name, value, why)
    balance = _get(args, "moe_router_load_balancing_type", "aux_loss")
    kinds = list(balance) if isinstance(balance, list | tuple) else [balance]
    if len(kinds) != 1 or kinds[0] not in ("aux_loss", "seq_aux_loss", "none"):
        raise _refuse(
            source,
            "moe_router_load_balancing_type",
            balance,
            "one of aux_loss, seq_aux_loss and none is built",
        )
    capacity = _get(args, "moe_expert_capacity_factor")
    if capacity is not None and float(capacity) < 0:
        capacity = None  # Megatron-Core: a negative factor means dropless
    policy = _get(args, "moe_token_drop_policy", "probs")
    if capacity is not None and policy != "probs":
        raise _refuse(source, "moe_token_drop_policy", policy, "epochal drops by probability")
    freq = _get(args, "moe_layer_freq", 1)
    if isinstance(freq, tuple):
        freq = list(freq)
    if not isinstance(freq, int | list) or isinstance(freq, bool):
        raise ConversionError(
            f"{source}: args.moe_layer_freq={freq!r} must be an integer or a list of 0/1 per layer"
        )
    shared = _get(args, "moe_shared_expert_intermediate_size")
    return {
        "num_experts": int(n),
        "moe_router_topk": int(_get(args, "moe_router_topk", 2)),
        "moe_ffn_hidden_size": _get(args, "moe_ffn_hidden_size"),
        "moe_shared_expert_intermediate_size": None if not shared else int(shared),
        "moe_shared_expert_gate": bool(_get(args, "moe_shared_expert_gate", False)),
        "moe_router_pre_softmax": bool(_get(args, "moe_router_pre_softmax", False)),
        "moe_aux_loss_coeff": float(_get(args, "moe_aux_loss_coeff", 0.0)),
        "moe_z_loss_coeff": float(_get(args, "moe_z_loss_coeff", 0.0)),
        "moe_expert_capacity_factor": None if capacity is None else float(capacity),
        "moe_layer_freq": freq,
        **_router_fields(args, score, kinds[0]),
    }


def _router_fields(args: Namespace, score: str, balance: str) -> dict[str, Any]:
    """The score function, balancing bias, group limit, scaling and balance loss of ``args``."""
    scale = _get(args, "moe_router_topk_scaling_factor")
    groups, group_topk = _get(args, "moe_router_num_groups"), _get(args, "moe_router_group_topk")
    return {
        "moe_router_score_function": score,
        "moe_router_enable_expert_bias": bool(_get(args, "moe_router_enable_expert_bias", False)),
        "moe_router_bias_update_rate": float(_get(args, "moe_router_bias_update_rate", 1e-3)),
        "moe_router_num_groups": int(groups) if groups and group_topk else None,
        "moe_router_group_topk": int(group_topk) if groups and group_topk else None,
        "moe_router_topk_scaling_factor": None if scale in (None, 1, 1.0) else float(scale),
        "moe_router_load_balancing_type": balance,
    }


def expert_parallel_size(args: Namespace, tensor_parallel: int, source: str) -> int:
    """``args.expert_model_parallel_size`` (1 when absent).

    Raises:
        ConversionError: an expert tensor-parallel size other than the tensor-parallel size.
    """
    ep = int(_get(args, "expert_model_parallel_size", 1))
    etp = _get(args, "expert_tensor_parallel_size")
    if _get(args, "num_experts") and etp is not None and int(etp) != tensor_parallel:
        raise _refuse(
            source,
            "expert_tensor_parallel_size",
            etp,
            f"legacy files are read with experts split like the dense layers, TP={tensor_parallel}",
        )
    return ep


# ----------------------------------------------------------------------------- legacy layouts
def grouped_to_sequential(
    state: dict[str, Any], *, num_local_experts: int, hidden: int, source: str
) -> dict[str, Any]:
    """One rank's ``GroupedMLP`` tensors (``mlp.experts.weight1/2``) as sequential experts.

    ``weight1`` ``[hidden, E_local * r1]`` is ``[E_local, hidden, r1]`` in memory
    (``GroupedMLP.forward``'s view): expert ``i``'s ``linear_fc1`` is that ``[i]`` transposed
    (``[r1, hidden]``: this rank's ``[gate; up]`` rows); ``weight2`` ``[E_local * r2, hidden]``
    viewed ``[E_local, r2, hidden]`` gives ``linear_fc2`` ``[hidden, r2]`` transposed.

    Raises:
        ConversionError: a weight whose size is not ``E_local`` experts of ``hidden`` (names the key).
    """
    out: dict[str, Any] = {}
    for name, value in state.items():
        m = re.match(r"^(.*\.mlp\.experts\.)weight([12])$", name)
        if m is None:
            out[name] = value
            continue
        fc = "linear_fc1" if m.group(2) == "1" else "linear_fc2"
        rows = value.numel() // max(1, num_local_experts * hidden)
        if value.dim() != 2 or value.numel() != num_local_experts * hidden * rows:
            raise ConversionError(
                f"{source}: {name} of shape {tuple(value.shape)} does not hold "
                f"{num_local_experts} experts of hidden size {hidden}"
            )
        if fc == "linear_fc1":
            experts = value.reshape(num_local_experts, hidden, rows).transpose(1, 2)
        else:
            experts = value.reshape(num_local_experts, rows, hidden).transpose(1, 2)
        for i in range(num_local_experts):
            out[f"{m.group(1)}local_experts.{i}.{fc}.weight"] = experts[i].contiguous()
    return out


def merge_expert_ranks(
    states: Sequence[dict[str, Any]], *, num_local_experts: int, sources: Sequence[str]
) -> dict[str, Any]:
    """Expert-parallel ranks' files (one TP x PP position) into one state with global experts.

    Rank ``r``'s ``local_experts.i`` becomes ``local_experts.{r * E_local + i}``; every
    other tensor must be the same on all ranks.

    Raises:
        ConversionError: a rank holds other experts or other tensors than rank 0 (names the file
            and key).
    """
    if len(states) == 1:
        return dict(states[0])
    out: dict[str, Any] = {}
    for rank, (state, source) in enumerate(zip(states, sources)):
        shared = set()
        for name, value in state.items():
            m = _EXPERT.match(name)
            if m is not None:
                local = int(m.group(2))
                if local >= num_local_experts:
                    raise ConversionError(
                        f"{source}: {name}: local expert {local} on an expert-parallel rank "
                        f"holding {num_local_experts} experts"
                    )
                out[f"{m.group(1)}{rank * num_local_experts + local}{m.group(3)}"] = value
                continue
            shared.add(name)
            if rank == 0:
                out[name] = value
                continue
            first = out.get(name)
            if name not in out or (
                isinstance(value, torch.Tensor)
                and (value.shape != first.shape or not torch.equal(value, first))
            ):
                raise ConversionError(
                    f"{source}: {name} differs from expert-parallel rank 0 ({sources[0]}); "
                    "the tensors outside the experts are the same on every expert rank"
                )
        if rank and shared != {n for n in states[0] if _EXPERT.match(n) is None}:
            missing = sorted({n for n in states[0] if _EXPERT.match(n) is None} - shared)
            raise ConversionError(
                f"{source}: lacks {missing[:4]} that expert-parallel rank 0 ({sources[0]}) has"
            )
    return out


def split_expert_ranks(
    state: dict[str, Any], *, expert_parallel: int, num_experts: int
) -> list[dict[str, Any]]:
    """Inverse of :func:`merge_expert_ranks`: one state per expert rank, local expert indices."""
    if expert_parallel == 1:
        return [state]
    per = num_experts // expert_parallel
    out: list[dict[str, Any]] = [{} for _ in range(expert_parallel)]
    for name, value in state.items():
        m = _EXPERT.match(name)
        if m is None:
            for shard in out:
                shard[name] = value
        else:
            e = int(m.group(2))
            out[e // per][f"{m.group(1)}{e % per}{m.group(3)}"] = value
    return out


# ----------------------------------------------------------------------------- torch_dist
_DIST_EXPERTS = re.compile(r"^(.*\.mlp\.experts\.)experts\.(linear_fc[12]\.(?:weight|bias))$")
_FULL_EXPERT = re.compile(
    r"^(.*\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12]\.(?:weight|bias))$"
)


def experts_from_dist(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``...mlp.experts.experts.linear_fc1.weight`` ``[E, ...]`` -> ``...local_experts.{e}.linear_fc1.weight``."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        m = _DIST_EXPERTS.match(name)
        if m is None:
            out[name] = tensor
            continue
        for e in range(tensor.shape[0]):
            out[f"{m.group(1)}local_experts.{e}.{m.group(2)}"] = tensor[e]
    return out


def experts_to_dist(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`experts_from_dist` (experts stacked in global order)."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        m = _FULL_EXPERT.match(name)
        if m is None:
            out[name] = tensor
        else:
            stacks.setdefault(f"{m.group(1)}experts.{m.group(3)}", {})[int(m.group(2))] = tensor
    for name, experts in stacks.items():
        out[name] = torch.stack([experts[e] for e in range(len(experts))])
    return out
