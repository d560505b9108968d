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
(:func:`epochal.formats.safe_load.safe_torch_load`). Optimizer and RNG state are
ignored. Mixture-of-experts models read from any TP x PP x EP, sequential or grouped
experts (:mod:`epochal.convert.megatron.moe`: the folder names, local and global expert
indices). Virtual-pipeline (``model0``, ``model1``, ...) checkpoints raise
:class:`ConversionError`.

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

import os
import re
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from epochal.convert.megatron.args import config_from_megatron_args
from epochal.convert.megatron.checkpoint import (
    MegatronCheckpoint,
    _bert_config,
    _ours_from_megatron_full,
    checkpoint_from_megatron_tensors,
)
from epochal.convert.megatron.layout import (
    megatron_model_type,
    merge_tp,
    qkv_rows_to_v2,
    shard_kind,
    to_local_names,
)
from epochal.convert.megatron.legacy_save import FILE_NAME, TRACKER_FILE, save_megatron_checkpoint
from epochal.convert.megatron.moe import grouped_to_sequential, merge_expert_ranks
from epochal.convert.megatron.nemo2 import is_nemo2, load_nemo2_checkpoint
from epochal.convert.megatron.torch_dist import is_torch_dist, read_torch_dist
from epochal.formats.common import ConversionError
from epochal.formats.safe_load import safe_torch_load

__all__ = [
    "MegatronCheckpoint",
    "checkpoint_from_megatron_tensors",
    "load_megatron_checkpoint",
    "save_megatron_checkpoint",
    "TRACKER_FILE",
]

_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")


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


def _rank_grid(folder: Path, read: Any) -> dict[tuple[int, int, int], Path]:
    """``(tensor, pipeline, expert) rank -> file`` of an iteration folder.

    Megatron-LM names a rank's folder ``mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]`` (the
    pipeline part only when PP > 1, the expert part only when EP > 1), so a two-part
    name is read as pipeline or expert rank as the first file's ``args`` say.

    Raises:
        FileNotFoundError: no rank folders.
        ConversionError: names of different shapes.
    """
    found: dict[Path, tuple[int, ...]] = {}
    for child in folder.iterdir():
        m = _RANK_DIR.match(child.name)
        if m and child.is_dir():
            found[child] = tuple(int(g) for g in m.groups() if g is not None)
    if not found:
        raise FileNotFoundError(f"{folder}: no mp_rank_* folders")
    if len({len(k) for k in found.values()}) > 1:
        raise ConversionError(
            f"{folder}: mp_rank_* folder names of different forms ({sorted(p.name for p in found)[:4]})"
        )
    parts = next(iter(found.values()))
    expert_second = False
    if len(parts) == 2:
        first = sorted(found)[0]
        _, args, _ = read(first / FILE_NAME)
        ep = getattr(args, "expert_model_parallel_size", None) or 1
        pp = getattr(args, "pipeline_model_parallel_size", None) or 1
        expert_second = isinstance(ep, int) and ep > 1 and pp == 1
    grid: dict[tuple[int, int, int], Path] = {}
    for child, k in found.items():
        if len(k) == 1:
            pos = (k[0], 0, 0)
        elif len(k) == 2:
            pos = (k[0], 0, k[1]) if expert_second else (k[0], k[1], 0)
        else:
            pos = (k[0], k[1], k[2])
        grid[pos] = child / FILE_NAME
    return grid


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
    version = payload.get("checkpoint_version", 0) or 0
    if not isinstance(version, int | float) or isinstance(version, bool) or version < 0:
        raise ConversionError(f"{path}: checkpoint_version must be a number >= 0, got {version!r}")
    if not isinstance(payload["model"], Mapping):
        raise ConversionError(
            f"{path}: 'model' is a {type(payload['model']).__name__}, expected a mapping of tensors"
        )
    state = _flatten(payload["model"])
    for name, value in state.items():
        if not isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):
            raise ConversionError(
                f"{path}: model entry {name!r} is a {type(value).__name__}, not a tensor"
            )
    return state, args, float(version)


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
    cache: dict[Path, tuple[dict[str, Any], Namespace, float]] = {}

    def read(path: Path) -> tuple[dict[str, Any], Namespace, float]:
        if path not in cache:
            cache[path] = _read_rank(path)
        return cache[path]

    egrid = _rank_grid(folder, read)
    tp = 1 + max(t for t, _, _ in egrid)
    pp = 1 + max(p for _, p, _ in egrid)
    ep = 1 + max(e for _, _, e in egrid)
    for t in range(tp):
        for p in range(pp):
            for e in range(ep):
                if (t, p, e) not in egrid:
                    raise ConversionError(
                        f"{folder}: rank folder for tensor rank {t}, pipeline rank {p}"
                        + (f", expert rank {e}" if ep > 1 else "")
                        + " is missing"
                    )
    grid = {(t, p): egrid[(t, p, 0)] for t, p, _ in egrid}
    raw_e = {pos: read(path) for pos, path in sorted(egrid.items())}
    raw = {(t, p): raw_e[(t, p, 0)] for t, p, _ in egrid}
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
    local_e = {pos: to_local_names(st, str(egrid[pos])) for pos, (st, _, _) in raw_e.items()}
    local = {(t, p): local_e[(t, p, 0)] for t, p, _ in egrid}
    embedding = [local[(t, 0)].get("embedding.word_embeddings.weight") for t in range(tp)]
    config, extras = config_from_megatron_args(
        args,
        vocab_size=vocab_size,
        make_vocab_size_divisible_by=make_vocab_size_divisible_by,
        source=str(grid[(0, 0)]),
        # the vocabulary checked against the (TP-sharded) embedding before any merge or cut
        embedding_rows=sum(int(e.shape[0]) for e in embedding)
        if all(isinstance(e, torch.Tensor) and e.dim() == 2 for e in embedding)
        else None,
    )
    if (extras.tensor_parallel, extras.pipeline_parallel, extras.expert_parallel) != (tp, pp, ep):
        raise ConversionError(
            f"{folder}: args say TP={extras.tensor_parallel} x PP={extras.pipeline_parallel} x "
            f"EP={extras.expert_parallel}, but the folder holds TP={tp} x PP={pp} x EP={ep} "
            "rank files"
        )
    if config.num_experts is not None:  # one state per TP x PP position, experts global
        per = config.num_experts // ep
        for pos in local_e:
            local_e[pos] = grouped_to_sequential(
                local_e[pos],
                num_local_experts=per,
                hidden=config.hidden_size,
                source=str(egrid[pos]),
            )
        local = {
            (t, p): merge_expert_ranks(
                [local_e[(t, p, e)] for e in range(ep)],
                num_local_experts=per,
                sources=[str(egrid[(t, p, e)]) for e in range(ep)],
            )
            for t in range(tp)
            for p in range(pp)
        }
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
