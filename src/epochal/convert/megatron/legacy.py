"""Megatron-LM's legacy (``--ckpt-format torch``) GPT and BERT checkpoints, both directions, any TP x PP.

Layout of a Megatron save directory::

    latest_checkpointed_iteration.txt        "1000" or "release"
    iter_0001000/                            (or release/)
        mp_rank_00/model_optim_rng.pt        PP = 1: one file per tensor-parallel rank
        mp_rank_00_000/model_optim_rng.pt    PP > 1: mp_rank_{tp:02d}_{pp:03d}

Each file is a ``torch.save`` dict with ``args`` (an ``argparse.Namespace``),
``checkpoint_version`` (3.0), ``iteration`` and ``model`` (that rank's shard;
layer indices are local to the pipeline stage). Megatron-Core models use
``embedding.*`` / ``decoder.layers.N.*`` / ``output_layer.*`` names; the older
non-core models nest ``language_model.{embedding,encoder,output_layer}`` dicts.
See :mod:`epochal.convert.megatron.layout` for the fused QKV / SwiGLU layouts
and the tensor-parallel sharding rules, :mod:`epochal.convert.megatron.args` for
the ``args`` mapping.

BERT (``model.type="bert"``, pre-LN) is Megatron-Core's ``BertModel``: its
transformer block is ``encoder.*`` (GPT's is ``decoder.*``; the layer names are
the same), plus ``embedding.tokentype_embeddings`` (first stage; replicated),
``lm_head.dense`` / ``lm_head.layer_norm`` (our ``lm_head.dense`` / ``lm_head.norm``),
``output_layer.bias`` (our ``lm_head.bias``; vocabulary-parallel and padded like
the word embeddings), ``pooler.dense`` and ``binary_head`` (last stage; replicated).
The decoder matrix is tied to the word embeddings (``pretrain_bert.py``), so the
last stage of a pipeline holds its synced copy as ``output_layer.weight``. The
legacy (non-core) ``BertModel`` names (``language_model.pooler``, ``lm_head.bias``,
``lm_head.layernorm``) import too. The model type is read from the tensor names of
all rank files (:func:`~epochal.convert.megatron.layout.megatron_model_type`);
``num_tokentypes`` and ``bert_binary_head`` from the tensors as well.

Import (:func:`load_megatron_checkpoint`) reads any TP x PP, Megatron-Core names
(local or Transformer-Engine spec) or legacy names, checkpoint versions 0-3,
``--rotary-interleaved`` (q/k rows permuted to our half-split RoPE layout) and
``--apply-layernorm-1p``; it never unpickles arbitrary objects
(:func:`epochal.convert.safe_load.safe_torch_load`). Optimizer and RNG state are
ignored. Virtual-pipeline (``model0``, ``model1``, ...) and expert-parallel
checkpoints raise :class:`ConversionError`.

Export (:func:`save_megatron_checkpoint`) writes Megatron-Core names for the
Transformer-Engine layer spec (``linear_qkv.layer_norm_weight``; Megatron-LM's
default ``--transformer-impl transformer_engine``) or the local spec
(``input_layernorm``), with ``_extra_state`` entries set to ``None`` as
Megatron's own modules expect when loading strictly. The files hold no optimizer
or RNG state: start Megatron-LM with ``--finetune`` (or ``--no-load-optim
--no-load-rng``). The iteration folder is written under a temporary name and
renamed when complete; the tracker file is replaced last.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from epochal._atomic import atomic_directory, atomic_write
from epochal.convert.common import (
    ConversionError,
    attach_output_head,
    check_shapes,
    complete_tied,
    resize_rows,
)
from epochal.convert.megatron.args import (
    CHECKPOINT_VERSION,
    MegatronExtras,
    config_from_megatron_args,
    megatron_args_from_config,
)
from epochal.convert.megatron.layout import (
    interleaved_to_half_rotary,
    megatron_model_type,
    merge_tp,
    pack_qkv,
    qkv_rows_to_v2,
    shard_kind,
    split_tp,
    to_local_names,
    unpack_qkv,
)
from epochal.convert.megatron.nemo2 import is_nemo2, load_nemo2_checkpoint
from epochal.convert.megatron.torch_dist import is_torch_dist, read_torch_dist, write_torch_dist
from epochal.convert.safe_load import safe_torch_load
from epochal.model.config import ModelConfig

__all__ = [
    "MegatronCheckpoint",
    "checkpoint_from_megatron_tensors",
    "load_megatron_checkpoint",
    "save_megatron_checkpoint",
    "TRACKER_FILE",
]

TRACKER_FILE = "latest_checkpointed_iteration.txt"
FILE_NAME = "model_optim_rng.pt"
Spec = Literal["transformer_engine", "local"]
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


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


# --------------------------------------------------------------------------- our <-> full Megatron
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
            if config.activation == "swiglu":
                if f"{src}mlp.w1.{kind}" in state:
                    out[f"{dst}mlp.linear_fc1.{kind}"] = torch.cat(
                        [state[f"{src}mlp.w1.{kind}"], state[f"{src}mlp.w3.{kind}"]]
                    )
                    out[f"{dst}mlp.linear_fc2.{kind}"] = state[f"{src}mlp.w2.{kind}"]
            elif f"{src}mlp.fc1.{kind}" in state:
                out[f"{dst}mlp.linear_fc1.{kind}"] = state[f"{src}mlp.fc1.{kind}"]
                out[f"{dst}mlp.linear_fc2.{kind}"] = state[f"{src}mlp.fc2.{kind}"]
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
#: Megatron tensors that live on the first / last pipeline stage (besides the layers).
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
            fc1 = take(f"{src}mlp.linear_fc1.{kind}")
            fc2 = take(f"{src}mlp.linear_fc2.{kind}")
            if config.activation == "swiglu":
                gate, up = fc1.chunk(2, dim=0)
                out[f"{dst}mlp.w1.{kind}"] = gate.contiguous()
                out[f"{dst}mlp.w3.{kind}"] = up.contiguous()
                out[f"{dst}mlp.w2.{kind}"] = fc2
            else:
                out[f"{dst}mlp.fc1.{kind}"] = fc1
                out[f"{dst}mlp.fc2.{kind}"] = fc2
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


# --------------------------------------------------------------------------- export
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


def _to_spec(name: str, spec: Spec) -> str:
    if spec == "local":
        return name
    name = re.sub(
        r"\.input_layernorm\.(weight|bias)$", r".self_attention.linear_qkv.layer_norm_\1", name
    )
    return re.sub(r"\.pre_mlp_layernorm\.(weight|bias)$", r".mlp.linear_fc1.layer_norm_\1", name)


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
            ``tensor_parallel``, the TP size of the job that loads it; PP = 1).

    Returns:
        The iteration folder.

    Raises:
        ConversionError: the model or layout cannot be expressed in Megatron, or
            ``state`` does not match ``config``.
        FileExistsError: the iteration folder exists and ``overwrite`` is false.
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
    if ckpt_format == "torch_dist":
        if pipeline_parallel != 1:
            raise ConversionError(
                "--pipeline-parallel: a torch_dist checkpoint holds no layout (write it with "
                "--pipeline-parallel 1; Megatron-Core loads it under any pipeline split)"
            )
        named = {_to_spec(k, "transformer_engine"): v.detach().cpu() for k, v in full.items()}
        if config.type == "bert":
            named = {re.sub(r"^decoder\.", "encoder.", k): v for k, v in named.items()}
        with atomic_directory(folder, overwrite=overwrite) as tmp:
            tmp.rmdir()
            write_torch_dist(tmp, named, args=args, iteration=iteration)
        atomic_write(directory / TRACKER_FILE, f"{iteration}\n")
        return folder
    if ckpt_format != "torch":
        raise ConversionError(f"--ckpt-format must be 'torch' or 'torch_dist', got {ckpt_format!r}")
    with atomic_directory(folder, overwrite=overwrite) as tmp:
        for p, layers in enumerate(stages):
            stage = _stage_state(
                full, config, layers, first=p == 0, last=p == pipeline_parallel - 1
            )
            shards: list[dict[str, Any]] = [{} for _ in range(tensor_parallel)]
            for name, tensor in stage.items():
                pieces = split_tp(
                    tensor.detach().cpu(), shard_kind(name, swiglu=swiglu), tensor_parallel
                )
                for t in range(tensor_parallel):
                    shards[t][_to_spec(name, spec)] = pieces[t].clone()
            for t, shard in enumerate(shards):
                _add_extra_state(shard, spec)
                if config.type == "bert":  # Megatron-Core BertModel's block is ``encoder``
                    shard = {re.sub(r"^decoder\.", "encoder.", k): v for k, v in shard.items()}
                rank_dir = tmp / (
                    f"mp_rank_{t:02d}" if pipeline_parallel == 1 else f"mp_rank_{t:02d}_{p:03d}"
                )
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
    layers = sorted(
        {int(m.group(1)) for k in shard if (m := re.match(r"decoder\.layers\.(\d+)\.", k))}
    )
    for i in layers:
        modules = list(_EXTRA_STATE_MODULES)
        if spec == "transformer_engine":
            modules.append("self_attention.core_attention")
        for module in modules:
            shard[f"decoder.layers.{i}.{module}._extra_state"] = None
    if "output_layer.weight" in shard or "output_layer.bias" in shard:
        shard["output_layer._extra_state"] = None


# --------------------------------------------------------------------------- import
def _resolve_folder(directory: Path, iteration: int | None) -> tuple[Path, int | None]:
    if any(_RANK_DIR.match(p.name) for p in directory.iterdir() if p.is_dir()):
        m = re.match(r"^iter_(\d+)$", directory.name)
        return directory, int(m.group(1)) if m else None
    if iteration is not None:
        folder = directory / f"iter_{iteration:07d}"
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such iteration folder")
        return folder, iteration
    tracker = directory / TRACKER_FILE
    if not tracker.is_file():
        raise FileNotFoundError(
            f"{directory}: no {TRACKER_FILE} and no mp_rank_* folders (not a Megatron checkpoint)"
        )
    text = tracker.read_text().strip()
    if text == "release":
        folder, it = directory / "release", None
    else:
        try:
            it = int(text)
        except ValueError:
            raise ConversionError(
                f"{tracker}: expected an iteration number or 'release', got {text!r}"
            ) from None
        folder = directory / f"iter_{it:07d}"
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: named by {tracker} but missing")
    return folder, it


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def _read_rank(path: Path) -> tuple[dict[str, Any], Namespace, float]:
    payload = safe_torch_load(path)
    if not isinstance(payload, dict):
        raise ConversionError(f"{path}: expected a dict, got {type(payload).__name__}")
    if "model" not in payload:
        if any(k.startswith("model") and k[5:].isdigit() for k in payload):
            raise ConversionError(
                f"{path}: virtual-pipeline checkpoints (model0, model1, ...) are not supported"
            )
        raise ConversionError(f"{path}: has no 'model' entry")
    args = payload.get("args")
    version = float(payload.get("checkpoint_version", 0) or 0)
    state = _flatten(payload["model"])
    return state, args, version


def load_megatron_checkpoint(
    directory: str | os.PathLike,
    *,
    iteration: int | None = None,
    vocab_size: int | None = None,
    make_vocab_size_divisible_by: int | None = None,
    model_type: Literal["gpt", "bert"] | None = None,
    model_config: str | os.PathLike | None = None,
) -> MegatronCheckpoint:
    """Read a Megatron-LM checkpoint (legacy files of any TP x PP, ``torch_dist``, or NeMo 2).

    Args:
        directory: the save directory (with ``latest_checkpointed_iteration.txt``)
            or one iteration folder (with ``mp_rank_*`` folders).
        iteration: which ``iter_*`` folder to read (default: the tracker's).
        vocab_size: the unpadded vocabulary size (default: ``args.vocab_size``,
            else ``args.padded_vocab_size``).
        make_vocab_size_divisible_by: our padding multiple (default: Megatron's).
        model_type: the model the caller expects (``"gpt"`` or ``"bert"``); default:
            whichever the tensor names show (:func:`~epochal.convert.megatron.layout.megatron_model_type`).
        model_config: NeMo 2 only: a JSON/YAML file of Megatron-Core config fields
            completing or replacing the checkpoint's context
            (:func:`~epochal.convert.megatron.nemo2.load_nemo2_checkpoint`).

    Raises:
        FileNotFoundError: folders or rank files are missing.
        ConversionError: an incomplete rank grid, unsupported features, tensors
            that do not match ``args``, or a model other than ``model_type``.
        UnsafeCheckpointError: a file holds objects outside the allow-list.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: not a folder")
    if is_nemo2(directory):
        return load_nemo2_checkpoint(
            directory,
            model_config=model_config,
            vocab_size=vocab_size,
            make_vocab_size_divisible_by=make_vocab_size_divisible_by,
            model_type=model_type,
        )
    if model_config is not None:
        raise ConversionError(
            f"--model-config applies to NeMo 2 checkpoints (weights/ + context/); "
            f"{directory} is not one"
        )
    if is_torch_dist(directory):
        m = re.match(r"^iter_(\d+)$", directory.name)
        folder, found_iteration = directory, (int(m.group(1)) if m else None)
    else:
        folder, found_iteration = _resolve_folder(directory, iteration)
    if is_torch_dist(folder):
        return _load_torch_dist(
            folder, found_iteration, vocab_size, make_vocab_size_divisible_by, model_type
        )
    grid: dict[tuple[int, int], Path] = {}
    for child in folder.iterdir():
        m = _RANK_DIR.match(child.name)
        if not m or not child.is_dir():
            continue
        if m.group(3) is not None:
            raise ConversionError(f"{child}: expert-parallel checkpoints are not supported")
        grid[(int(m.group(1)), int(m.group(2) or 0))] = child / FILE_NAME
    if not grid:
        raise FileNotFoundError(f"{folder}: no mp_rank_* folders")
    tp = 1 + max(t for t, _ in grid)
    pp = 1 + max(p for _, p in grid)
    for t in range(tp):
        for p in range(pp):
            if (t, p) not in grid:
                raise ConversionError(
                    f"{folder}: rank folder for tensor rank {t}, pipeline rank {p} is missing"
                )
    raw = {pos: _read_rank(path) for pos, path in sorted(grid.items())}
    _, args, version = raw[(0, 0)]
    t5_names = [
        n
        for state, _, _ in raw.values()
        for n in state
        if ".cross_attention." in n or ".inter_attention." in n
    ]
    if t5_names:
        raise ConversionError(
            f"{folder}: holds an encoder-decoder (T5) model ({t5_names[0]!r}); Megatron legacy "
            "T5 checkpoints are not supported (GPT and BERT are)"
        )
    found_type = megatron_model_type(n for state, _, _ in raw.values() for n in state)
    if model_type is not None and found_type != model_type:
        raise ConversionError(
            f"{folder}: holds a {found_type!r} model (Megatron "
            f"{'BertModel' if found_type == 'bert' else 'GPTModel'} tensor names), "
            f"expected model.type={model_type!r}"
        )
    config, extras = config_from_megatron_args(
        args,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        source=str(grid[(0, 0)]),
    )
    if (extras.tensor_parallel, extras.pipeline_parallel) != (tp, pp):
        raise ConversionError(
            f"{folder}: args say TP={extras.tensor_parallel} x PP={extras.pipeline_parallel}, "
            f"but the folder holds TP={tp} x PP={pp} rank files"
        )
    local = {pos: to_local_names(state, str(grid[pos])) for pos, (state, _, _) in raw.items()}
    if found_type == "bert":
        config = _bert_config(config, args, local[(0, 0)], local[(0, pp - 1)], str(folder))
    full: dict[str, torch.Tensor] = {}
    layer_offset = 0
    for p in range(pp):
        shards = []
        for t in range(tp):
            state = local[(t, p)]
            if version < 2.0:
                for name in [n for n in state if ".linear_qkv." in n]:
                    heads = config.num_attention_heads // tp
                    state[name] = qkv_rows_to_v2(state[name], version, heads, config.head_dim)
            shards.append(state)
        names = list(shards[0])
        for t, shard in enumerate(shards[1:], start=1):
            if set(shard) != set(names):
                raise ConversionError(
                    f"{grid[(t, p)]}: tensor names differ from tensor rank 0 of the same pipeline stage"
                )
        stage_layers = sorted(
            {int(m.group(1)) for n in names if (m := re.match(r"decoder\.layers\.(\d+)\.", n))}
        )
        if stage_layers != list(range(len(stage_layers))):
            raise ConversionError(f"{grid[(0, p)]}: layer indices {stage_layers} are not 0..n-1")
        for name in names:
            if name == "output_layer.weight" and config.tie_embeddings:
                continue  # the last stage's synced copy of the tied embedding
            value = merge_tp(
                [s[name] for s in shards],
                shard_kind(name, swiglu=extras.swiglu),
                f"{grid[(0, p)]}: {name}",
            )
            if (m := re.match(r"decoder\.layers\.(\d+)\.(.*)$", name)) is not None:
                name = f"decoder.layers.{int(m.group(1)) + layer_offset}.{m.group(2)}"
            if name in full:
                raise ConversionError(f"{grid[(0, p)]}: {name} appears in two pipeline stages")
            full[name] = value
        layer_offset += len(stage_layers)
    if layer_offset != config.num_layers:
        raise ConversionError(
            f"{folder}: found {layer_offset} layers, args.num_layers={config.num_layers}"
        )
    state = _ours_from_megatron_full(full, config, extras, str(folder))
    return MegatronCheckpoint(
        config=config,
        state=state,
        args=args,
        iteration=found_iteration,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )


def _load_torch_dist(
    folder: Path,
    found_iteration: int | None,
    vocab_size: int | None,
    make_vocab_size_divisible_by: int | None,
    model_type: str | None,
) -> MegatronCheckpoint:
    """A ``torch_dist`` iteration folder (:mod:`epochal.convert.megatron.torch_dist`) into our names."""
    flat, args = read_torch_dist(folder)
    if args is None:
        raise ConversionError(
            f"{folder}/common.pt: no 'args' (Megatron-LM saves them); cannot tell the model's "
            "configuration"
        )
    return checkpoint_from_megatron_tensors(
        flat,
        args,
        iteration=found_iteration,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        model_type=model_type,
        source=str(folder),
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

    Raises:
        ConversionError: the names show another model than ``model_type``, or the
            tensors do not match ``args``.
    """
    found_type = megatron_model_type(flat)
    if model_type is not None and found_type != model_type:
        raise ConversionError(
            f"{source}: holds a {found_type!r} model, expected model.type={model_type!r}"
        )
    config, extras = config_from_megatron_args(
        args,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        source=source,
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
