"""Export to Megatron-LM's legacy (``--ckpt-format torch``) checkpoint files, any TP x PP.

:func:`save_megatron_checkpoint` writes Megatron-Core names for the Transformer-Engine
layer spec or the local spec (see :mod:`epochal.convert.megatron.legacy` for the layout
of the folders and files and the options).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from epochal._atomic import atomic_directory, atomic_write
from epochal.convert.megatron.args import CHECKPOINT_VERSION, megatron_args_from_config
from epochal.convert.megatron.checkpoint import _megatron_full_from_ours
from epochal.convert.megatron.layout import shard_kind, split_tp
from epochal.convert.megatron.moe import experts_to_dist, split_expert_ranks
from epochal.convert.megatron.torch_dist import write_torch_dist
from epochal.formats.common import ConversionError, check_shapes, complete_tied, resize_rows
from epochal.model.config import ModelConfig
from epochal.model.moe_options import is_moe_layer

TRACKER_FILE = "latest_checkpointed_iteration.txt"
FILE_NAME = "model_optim_rng.pt"
Spec = Literal["transformer_engine", "local"]

# Megatron tensors that live on the first / last pipeline stage (besides the layers).
_FIRST_STAGE = (
    "embedding.word_embeddings.weight",
    "embedding.position_embeddings.weight",
    "embedding.tokentype_embeddings.weight",
)
_LAST_STAGE_PREFIXES = (
    "decoder.final_layernorm.",
    "lm_head.",
    "output_layer.bias",
    "pooler.",
    "binary_head.",
)


def _stage_layers(num_layers: int, pipeline_parallel: int) -> list[range]:
    if num_layers % pipeline_parallel:
        raise ConversionError(
            f"pipeline_parallel={pipeline_parallel} must divide num_layers={num_layers} (Megatron's even split)"
        )
    n = num_layers // pipeline_parallel
    return [range(p * n, (p + 1) * n) for p in range(pipeline_parallel)]


_EXTRA_STATE_MODULES = (
    "self_attention.linear_qkv",
    "self_attention.linear_proj",
    "mlp.linear_fc1",
    "mlp.linear_fc2",
)


def _to_spec(name: str, spec: Spec, moe_layers: frozenset[int] = frozenset()) -> str:
    """``name`` in ``spec``'s names; ``moe_layers`` keep ``pre_mlp_layernorm`` (not fused in MoE blocks)."""
    if spec == "local":
        return name
    name = re.sub(
        r"\.input_layernorm\.(weight|bias)$", r".self_attention.linear_qkv.layer_norm_\1", name
    )
    m = re.match(r"^decoder\.layers\.(\d+)\.", name)
    if m is not None and int(m.group(1)) in moe_layers:
        return name
    return re.sub(r"\.pre_mlp_layernorm\.(weight|bias)$", r".mlp.linear_fc1.layer_norm_\1", name)


def _moe_layers(config: ModelConfig, layers: range | None = None) -> frozenset[int]:
    """Indices (in ``layers``' numbering from 0, default all) of the MoE blocks."""
    layers = range(config.num_layers) if layers is None else layers
    return frozenset(j for j, i in enumerate(layers) if is_moe_layer(config, i))


def save_megatron_checkpoint(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    directory: str | os.PathLike,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    iteration: int = 0,
    spec: Spec = "transformer_engine",
    dtype: torch.dtype | None = None,
    overwrite: bool = False,
    ckpt_format: Literal["torch", "torch_dist"] = "torch",
    expert_parallel: int = 1,
) -> Path:
    """Write our model as a Megatron-LM checkpoint: legacy files sharded TP x PP, or ``torch_dist``.

    Args:
        config: our model config.
        state: our state dict (full tensors).
        directory: the Megatron save directory (``--load`` of Megatron-LM).
        tensor_parallel: target tensor-parallel size (divides heads, groups, ffn and vocab padding).
        pipeline_parallel: target pipeline size (divides ``num_layers``).
        iteration: written to ``iter_{iteration:07d}`` and the tracker file.
        spec: ``"transformer_engine"`` (Megatron-LM's default) or ``"local"`` names.
        dtype: cast floating tensors (default: keep).
        overwrite: replace an existing iteration folder.
        ckpt_format: ``"torch"`` (legacy ``mp_rank_*`` files; the default) or
            ``"torch_dist"`` (Megatron-LM's default format: one layout-free folder,
            :mod:`epochal.convert.megatron.torch_dist`, with Transformer-Engine names as
            Megatron-Core saves them for either spec; the vocabulary is padded for
            ``tensor_parallel``, the TP size of the job that loads it; PP = 1). For a
            mixture of experts its MoE blocks' pre-MLP norm is named as ``spec`` saves it.
        expert_parallel: target expert-parallel size (mixture of experts, legacy files:
            divides ``num_experts``; ``mp_rank_*_{ep:03d}`` folders, each with its experts
            under local indices; :mod:`epochal.convert.megatron.moe`).

    Returns:
        The iteration folder.

    Raises:
        ConversionError: the model or layout cannot be expressed in Megatron, or
            ``state`` does not match ``config``.
        FileExistsError: the iteration folder exists, or the directory's tracker names a
            newer iteration, and ``overwrite`` is false.
    """
    if spec not in ("transformer_engine", "local"):
        raise ConversionError(
            f"--megatron-spec must be 'transformer_engine' or 'local', got {spec!r}"
        )
    if config.type == "t5":
        raise ConversionError(
            "model.type='t5': Megatron legacy T5 checkpoints are not supported (GPT and BERT "
            "are); convert T5 to Hugging Face with --to hf"
        )
    if tensor_parallel < 1 or pipeline_parallel < 1:
        raise ConversionError("tensor_parallel and pipeline_parallel must be >= 1")
    for name, value in (
        ("num_attention_heads", config.num_attention_heads),
        ("num_query_groups", config.num_kv_heads),
        ("ffn_hidden_size", config.ffn_size),
        *([("moe_ffn_hidden_size", config.moe_ffn_size)] if config.num_experts is not None else []),
        *(
            [("moe_shared_expert_intermediate_size", config.moe_shared_expert_intermediate_size)]
            if config.num_experts is not None and config.moe_shared_expert_intermediate_size
            else []
        ),
    ):
        if value % tensor_parallel:
            raise ConversionError(f"tensor_parallel={tensor_parallel} must divide {name}={value}")
    stages = _stage_layers(config.num_layers, pipeline_parallel)
    out_dtype = dtype or state.get("tok_embeddings.weight", torch.empty(0)).dtype
    args = megatron_args_from_config(
        config,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        iteration=iteration,
        dtype=out_dtype,
        transformer_impl=spec,
        expert_parallel=expert_parallel,
    )
    state = complete_tied(config, state)
    check_shapes(state, config, "model state")
    full = _megatron_full_from_ours(state, config)
    for name in ("embedding.word_embeddings.weight", "output_layer.weight", "output_layer.bias"):
        if name in full:
            full[name] = resize_rows(full[name], args.padded_vocab_size)
    if dtype is not None:
        full = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
    swiglu = config.activation == "swiglu"
    directory = Path(directory)
    folder = directory / f"iter_{iteration:07d}"
    if not overwrite:
        _check_tracker(directory, iteration)
    if ckpt_format == "torch_dist":
        if pipeline_parallel != 1:
            raise ConversionError(
                "--pipeline-parallel: a torch_dist checkpoint holds no layout (write it with "
                "--pipeline-parallel 1; Megatron-Core loads it under any pipeline split)"
            )
        if expert_parallel != 1:
            raise ConversionError(
                "--expert-parallel: a torch_dist checkpoint holds no layout (write it with "
                "--expert-parallel 1; Megatron-Core loads it under any expert-parallel size)"
            )
        # Megatron-Core saves a dense block's pre-MLP norm under the fused TE name in both specs,
        # an MoE block's as the spec names it
        moe = _moe_layers(config) if spec == "transformer_engine" else frozenset()
        named = {_to_spec(k, "transformer_engine", moe): v.detach().cpu() for k, v in full.items()}
        if config.type == "bert":
            named = {re.sub(r"^decoder\.", "encoder.", k): v for k, v in named.items()}
        with atomic_directory(folder, overwrite=overwrite) as tmp:
            tmp.rmdir()
            write_torch_dist(
                tmp,
                experts_to_dist(named),
                args=args,
                iteration=iteration,
                # Megatron-Core keys each block apart when not all blocks are alike
                per_layer=config.num_experts is not None and config.moe_layer_freq != 1,
            )
        atomic_write(directory / TRACKER_FILE, f"{iteration}\n")
        return folder
    if ckpt_format != "torch":
        raise ConversionError(f"--ckpt-format must be 'torch' or 'torch_dist', got {ckpt_format!r}")
    with atomic_directory(folder, overwrite=overwrite) as tmp:
        for p, layers in enumerate(stages):
            stage = _stage_state(
                full, config, layers, first=p == 0, last=p == pipeline_parallel - 1
            )
            moe = _moe_layers(config, layers)
            shards: list[dict[str, Any]] = [{} for _ in range(tensor_parallel)]
            for name, tensor in stage.items():
                pieces = split_tp(
                    tensor.detach().cpu(), shard_kind(name, swiglu=swiglu), tensor_parallel
                )
                for t in range(tensor_parallel):
                    shards[t][_to_spec(name, spec, moe)] = pieces[t].clone()
            for t, tp_shard in enumerate(shards):
                for e, shard in enumerate(
                    split_expert_ranks(
                        tp_shard,
                        expert_parallel=expert_parallel,
                        num_experts=config.num_experts or 1,
                    )
                ):
                    _add_extra_state(shard, spec)
                    if config.type == "bert":  # Megatron-Core BertModel's block is ``encoder``
                        shard = {re.sub(r"^decoder\.", "encoder.", k): v for k, v in shard.items()}
                    name = f"mp_rank_{t:02d}"  # Megatron-LM's get_checkpoint_name
                    if pipeline_parallel > 1:
                        name += f"_{p:03d}"
                    if expert_parallel > 1:
                        name += f"_{e:03d}"
                    rank_dir = tmp / name
                    rank_dir.mkdir()
                    payload = {
                        "args": args,
                        "checkpoint_version": CHECKPOINT_VERSION,
                        "iteration": iteration,
                        "model": shard,
                        "num_floating_point_operations_so_far": 0,
                    }
                    torch.save(payload, rank_dir / FILE_NAME)
    atomic_write(directory / TRACKER_FILE, f"{iteration}\n")
    return folder


def _check_tracker(directory: Path, iteration: int) -> None:
    """Refuse to move an existing save directory's tracker back to an older iteration.

    Raises:
        FileExistsError: the tracker names a newer iteration (or ``release``); the
            message says that ``--overwrite`` makes ``iteration`` the latest anyway.
    """
    tracker = directory / TRACKER_FILE
    if not tracker.is_file():
        return
    text = tracker.read_text(errors="replace").strip()
    newer = text == "release" or (text.isdigit() and int(text) > iteration)
    if newer:
        raise FileExistsError(
            f"{tracker}: names iteration {text!r}, newer than {iteration}; writing iteration "
            f"{iteration} would make it the latest (pass overwrite / --overwrite to do so, or "
            "--megatron-iteration to write a newer one)"
        )


def _stage_state(
    full: dict[str, torch.Tensor], config: ModelConfig, layers: range, *, first: bool, last: bool
) -> dict[str, torch.Tensor]:
    stage: dict[str, torch.Tensor] = {}
    if first:
        for name in _FIRST_STAGE:
            if name in full:
                stage[name] = full[name]
    for local, i in enumerate(layers):
        prefix = f"decoder.layers.{i}."
        for name, tensor in full.items():
            if name.startswith(prefix):
                stage[f"decoder.layers.{local}.{name[len(prefix) :]}"] = tensor
    if last:
        for name, tensor in full.items():
            if name.startswith(_LAST_STAGE_PREFIXES):
                stage[name] = tensor
        if config.tie_embeddings:
            if not first:  # Megatron keeps a synced copy of the embedding on the last stage
                stage["output_layer.weight"] = full["embedding.word_embeddings.weight"]
        else:
            stage["output_layer.weight"] = full["output_layer.weight"]
    return stage


def _add_extra_state(shard: dict[str, Any], spec: Spec) -> None:
    """The ``_extra_state`` entries Megatron-Core's linear layers (and TE attention) save."""
    layers = sorted(
        {int(m.group(1)) for k in shard if (m := re.match(r"decoder\.layers\.(\d+)\.", k))}
    )
    for i in layers:
        modules = list(_EXTRA_STATE_MODULES[:2])
        if spec == "transformer_engine":
            modules.append("self_attention.core_attention")
        prefix = f"decoder.layers.{i}."
        modules += sorted(  # the MLP's linear layers: dense, each expert's, the shared expert's
            {
                m.group(1)
                for k in shard
                if k.startswith(prefix)
                and (m := re.match(r"^(mlp\..*linear_fc[12])\.(weight|bias)$", k[len(prefix) :]))
            }
        )
        for module in modules:
            shard[f"{prefix}{module}._extra_state"] = None
    if "output_layer.weight" in shard or "output_layer.bias" in shard:
        shard["output_layer._extra_state"] = None
