"""Read Megatron-Core's distributed checkpoints (``--ckpt-format torch_dist``), any layout.

Layout of an iteration folder (``iter_0001000/``, next to
``latest_checkpointed_iteration.txt`` as for legacy checkpoints)::

    metadata.json        {"sharded_backend": "torch_dist", ...}
    .metadata            PyTorch DCP metadata: every tensor's global shape and shards
    __R_I.distcp         the shards, written by every rank
    common.pt            a torch.save dict with the non-sharded items (``args``, ...)

The tensors are stored with their *global* shapes, whatever the TP x PP (x DP) layout
that saved them, and the transformer layers stacked along a leading layer dimension
(``decoder.layers.self_attention.linear_qkv.weight`` is ``[num_layers, q+k+v rows,
hidden]``; the fused QKV and SwiGLU layouts are Megatron's, as in the legacy files).
So reading needs no knowledge of the saving layout: PyTorch's own DCP reader loads each
model tensor whole (metadata read with the restricted unpickler), the stacks are split
into ``decoder.layers.{i}.*``, and the legacy path's name mapping
(:mod:`epochal.convert.megatron.legacy`) turns them into ours. Optimizer state and
RNG states in the folder are not read. The model configuration comes from ``args`` in
``common.pt`` (read with :func:`~epochal.formats.safe_load.safe_torch_load`).

Writing (:func:`write_torch_dist`) is the reverse: the layers stacked, one DCP save from
one process with the global tensors (Megatron-Core reshards them for the loading
job's layout), ``args`` and the iteration in ``common.pt``, and ``metadata.json``. The
files carry no optimizer state (Megatron-LM loads them with ``--finetune`` /
``--no-load-optim``).

Mixture-of-experts blocks: each block's experts are one tensor ``[E, ...]``
(``mlp.experts.experts.linear_fc1.weight``), split into experts on reading and stacked
on writing; see :mod:`epochal.convert.megatron.moe`.

Errors (:class:`~epochal.formats.common.ConversionError`, naming the folder): a folder
that is not ``torch_dist``, missing shard files (named), no ``args``, multi-latent
attention or other unsupported layers (named).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from epochal._dcp import single_process_dcp
from epochal.convert.megatron.moe import experts_from_dist
from epochal.formats.common import ConversionError
from epochal.formats.safe_load import safe_torch_load

__all__ = ["is_torch_dist", "read_torch_dist", "stack_layers", "write_torch_dist"]

#: top-level module names of a Megatron-Core model's tensors (the rest is optimizer/RNG state).
_MODEL_PREFIXES = (
    "embedding.",
    "decoder.",
    "encoder.",
    "output_layer.",
    "lm_head.",
    "pooler.",
    "binary_head.",
    "position_embeddings.",
)
_UNSUPPORTED = (
    (
        re.compile(r"\.self_attention\.(linear_q_down|linear_kv_down|linear_q_up)"),
        "multi-latent attention",
    ),
    (re.compile(r"\.cross_attention\."), "encoder-decoder (T5) cross-attention"),
)


def is_torch_dist(folder: str | Path) -> bool:
    """True if ``folder`` is a ``torch_dist`` checkpoint (its ``metadata.json`` says so)."""
    path = Path(folder) / "metadata.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("sharded_backend") == "torch_dist"
    except (json.JSONDecodeError, AttributeError):
        return False


def read_torch_dist(
    folder: str | Path, *, key_prefix: str = ""
) -> tuple[dict[str, torch.Tensor], Any]:
    """The model tensors (Megatron-Core names, layers unstacked) and ``args`` of ``folder``.

    ``key_prefix`` is stripped from the stored names first (NeMo 2 saves the model
    under ``module.``); names without it (optimizer state) are not read.

    Returns:
        ``({"decoder.layers.0.self_attention.linear_qkv.weight": ..., ...}, args)``:
        full (global) CPU tensors; ``args`` as saved (None when ``common.pt`` has none).

    Raises:
        ConversionError: not a ``torch_dist`` folder, a shard file is missing or
            unreadable, or an unsupported layer type (named).
        UnsafeCheckpointError: ``common.pt`` holds objects outside the allow-list.
    """
    from epochal.train.state.checkpoint import (
        CheckpointError,
        SafeFileSystemReader,
        SafeLoadPlanner,
    )
    from epochal.train.state.dcp_checks import dcp_failure

    folder = Path(folder)
    if not is_torch_dist(folder):
        raise ConversionError(f"{folder}: not a Megatron torch_dist checkpoint (no metadata.json)")
    reader = SafeFileSystemReader(str(folder))
    try:  # the metadata is checked against the files here (paths, chunks, sizes)
        metadata = reader.read_metadata()
    except CheckpointError as exc:
        raise ConversionError(str(exc)) from exc
    wanted: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if not key.startswith(key_prefix) or not isinstance(meta, TensorStorageMetadata):
            continue
        if not key[len(key_prefix) :].startswith(_MODEL_PREFIXES):
            continue
        for pattern, what in _UNSUPPORTED:
            if pattern.search(key):
                raise ConversionError(f"{folder}: {what} ({key!r}) are not supported")
        wanted[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not wanted:
        raise ConversionError(f"{folder}: no model tensors in the DCP metadata")
    try:
        with single_process_dcp():
            dcp_load(wanted, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP wraps reader errors
        cause = dcp_failure(exc)
        if isinstance(cause, CheckpointError):  # a damaged shard, named
            raise ConversionError(str(cause)) from exc
        raise ConversionError(
            f"{folder}: cannot read the shards ({type(cause).__name__}: {cause})"
        ) from exc
    common = folder / "common.pt"
    args = None
    if common.is_file():
        payload = safe_torch_load(common)
        if isinstance(payload, dict):
            args = payload.get("args")
    return experts_from_dist(_unstack({k[len(key_prefix) :]: v for k, v in wanted.items()})), args


def _unstack(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{decoder,encoder}.layers.X`` ``[L, ...]`` -> ``{decoder,encoder}.layers.{i}.X``."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        m = re.match(r"^(decoder|encoder)\.layers\.(?!\d+\.)(.*)$", name)
        if m is None:
            out[name] = tensor
            continue
        for i in range(tensor.shape[0]):  # views: the stack's memory is not copied
            out[f"{m.group(1)}.layers.{i}.{m.group(2)}"] = tensor[i]
    return out


def stack_layers(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of the unstacking: ``decoder.layers.{i}.X`` -> ``decoder.layers.X`` ``[L, ...]``.

    Raises:
        ConversionError: ``X`` is not in every layer (blocks of different kinds: write them
            ``per_layer``, as Megatron-Core does).
    """
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        m = re.match(r"^(decoder|encoder)\.layers\.(\d+)\.(.*)$", name)
        if m is None:
            out[name] = tensor
        else:
            stacks.setdefault(f"{m.group(1)}.layers.{m.group(3)}", {})[int(m.group(2))] = tensor
    count = 1 + max((i for layers in stacks.values() for i in layers), default=-1)
    for name, layers in stacks.items():
        if sorted(layers) != list(range(count)):
            raise ConversionError(f"{name} is not in every one of the {count} layers")
        out[name] = torch.stack([layers[i] for i in range(count)])
    return out


_LINEAR = re.compile(
    r"^(decoder|encoder)\.layers\.(\d+)\.(.*(?:linear_proj|linear_qkv|linear_fc1|linear_fc2))"
    r"\.(?:weight|bias)$"
)


def write_torch_dist(
    folder: Path,
    tensors: dict[str, torch.Tensor],
    *,
    args: Any,
    iteration: int,
    per_layer: bool = False,
) -> None:
    """Write ``tensors`` (full Megatron-Core names, layers unstacked) as a ``torch_dist`` folder.

    ``folder`` must not exist yet and is written in place (the caller renames a
    temporary folder into place). Each linear layer of a block gets the
    ``_extra_state`` object Megatron-Core's modules save: Megatron-Core stores a
    sharded object as the pickled list of its data (here ``[None]``: no FP8 metadata),
    one per layer (``shard_{i}_{L}``) and expert (``mlp.experts.experts.*``, stacked
    ``[E, ...]``: ``shard_{i}.{e}_{L}.{E}``). ``per_layer`` keys every block apart
    (``decoder.layers.{i}.*``, no layer dimension; ``shard_0_1`` / ``shard_{e}_{E}``), as
    Megatron-Core does when its blocks differ (``moe_layer_freq`` other than 1).
    """
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    stacked = tensors if per_layer else stack_layers(tensors)
    state: dict[str, Any] = {k: v.contiguous() for k, v in stacked.items()}
    counts: dict[str, int] = {}  # "decoder" (GPT) or "encoder" (BERT) -> number of layers
    for k in tensors:
        if m := re.match(r"^(decoder|encoder)\.layers\.(\d+)\.", k):
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    for k, v in tensors.items():
        if (m := _LINEAR.match(k)) is None:
            continue
        block, i, module = m.group(1), int(m.group(2)), m.group(3)
        layers = counts[block]
        experts = (
            v.shape[0]
            if module.endswith(("experts.experts.linear_fc1", "experts.experts.linear_fc2"))
            else None
        )
        if per_layer:
            base, shards = (
                f"{block}.layers.{i}.{module}._extra_state",
                (
                    ["shard_0_1"]
                    if experts is None
                    else [f"shard_{e}_{experts}" for e in range(experts)]
                ),
            )
        else:
            base, shards = (
                f"{block}.layers.{module}._extra_state",
                (
                    [f"shard_{i}_{layers}"]
                    if experts is None
                    else [f"shard_{i}.{e}_{layers}.{experts}" for e in range(experts)]
                ),
            )
        for shard in shards:
            state[f"{base}/{shard}"] = [None]
    if "encoder" in counts and "output_layer.bias" in tensors:
        # BertModel's output layer is a ColumnParallelLinear of its own (GPT's is not saved so)
        state["output_layer._extra_state/shard_0_1"] = [None]
    folder.mkdir(parents=True)
    with single_process_dcp():
        dcp_save(
            state,
            storage_writer=FileSystemWriter(str(folder)),
            planner=DefaultSavePlanner(flatten_state_dict=False),
            no_dist=True,
        )
    torch.save(
        {"args": args, "iteration": iteration, "checkpoint_version": 3.0}, folder / "common.pt"
    )
    (folder / "metadata.json").write_text(
        json.dumps(
            {
                "sharded_backend": "torch_dist",
                "sharded_backend_version": 1,
                "common_backend": "torch",
                "common_backend_version": 1,
            }
        )
    )
