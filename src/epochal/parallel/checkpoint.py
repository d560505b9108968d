"""Checkpoints that reshard across layouts, and a consolidated single-file export.

Resharding: checkpoints are DCP folders keyed by fully-qualified names (layer
names are global under pipeline parallelism) with DTensor shards for
tensor/data-parallel parameters and optimizer state, so DCP loads a checkpoint
saved under one layout (TP2 x PP2, ...) into any other (TP1 x PP1 x DP4, one
process, ...): every rank reads the slices its own shards cover.

One name needs care: with tied embeddings, a single process (or the first
pipeline stage) knows the shared matrix's optimizer state as
``tok_embeddings.weight``, while the last pipeline stage holds its copy as
``output.weight``. :class:`TiedOptimizerState` stores and loads that copy's
optimizer state under the ``tok_embeddings.weight`` names, so every layout
writes and reads the same keys (the two copies are equal, DCP writes one). The
model entries need nothing: model state dicts hold both names in every layout.

Export: :func:`consolidate_checkpoint` reads the model entries of a DCP
checkpoint in ONE process (no process group; any saving layout) and writes a
single ``safetensors`` file of full tensors, e.g. for inference or conversion.
The file records the SHA-256 of its own bytes in its metadata
(:func:`epochal._checksum.seal_safetensors`), and :func:`load_consolidated`
verifies it: a damaged file is an error naming it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from epochal._atomic import atomic_path
from epochal._checksum import placeholder_metadata, seal_safetensors, verify_safetensors
from epochal._dcp import single_process_dcp

__all__ = ["TiedOptimizerState", "consolidate_checkpoint", "load_consolidated"]

_OUT, _IN = "output.weight", "tok_embeddings.weight"


def _rename(key: str, old: str, new: str) -> str:
    for prefix in ("state.", "param_groups."):
        if key.startswith(prefix + old + "."):
            return prefix + new + key[len(prefix + old) :]
    return key


class TiedOptimizerState:
    """A DCP ``Stateful`` around an optimizer container that renames a tied head's state.

    Args:
        optimizers: an object with flattened FQN-keyed ``state_dict()`` /
            ``load_state_dict()`` (e.g. :class:`epochal.train.optim.optimizer.OptimizersContainer`).
        rename: True on a rank that holds the tied ``output.weight`` but not
            ``tok_embeddings.weight`` (the last pipeline stage); otherwise this
            wrapper changes nothing.
    """

    def __init__(self, optimizers: Any, rename: bool) -> None:
        self.optimizers = optimizers
        self.rename = rename

    def state_dict(self) -> dict[str, Any]:
        """The wrapped state dict, the head's entries under ``tok_embeddings.weight`` names."""
        sd = self.optimizers.state_dict()
        if not self.rename:
            return sd
        return {_rename(k, _OUT, _IN): v for k, v in sd.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load, mapping the ``tok_embeddings.weight`` entries back to ``output.weight``."""
        if self.rename:
            state_dict = {_rename(k, _IN, _OUT): v for k, v in state_dict.items()}
        self.optimizers.load_state_dict(state_dict)


def _model_entries(metadata: Any, prefix: str) -> dict[str, TensorStorageMetadata]:
    return {
        key[len(prefix) :]: meta
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }


def consolidate_checkpoint(
    folder: str | os.PathLike,
    out_file: str | os.PathLike,
    *,
    reader: Any,
    planner: Any,
    prefix: str = "model.",
    dtype: torch.dtype | None = None,
    skip: Iterable[str] = (),
) -> dict[str, tuple[int, ...]]:
    """Write the model of a DCP checkpoint (saved under any layout) as one safetensors file.

    Runs in a single process without a process group. The file is written to a
    temporary name and renamed when complete.

    Args:
        folder: a checkpoint folder (``.../checkpoints/step_0000100``).
        out_file: the ``.safetensors`` file to write.
        reader: a DCP storage reader of ``folder`` and ``planner`` a DCP load
            planner; pass safe ones (the training layer's
            ``SafeFileSystemReader(folder)`` / ``SafeLoadPlanner()``), never one
            that unpickles arbitrary objects.
        prefix: the key prefix of the model entries in the checkpoint.
        dtype: convert floating-point tensors to this dtype (None = as saved).
        skip: names (without ``prefix``) to leave out, e.g. ``["output.weight"]``
            for a tied model.

    Returns:
        ``{name: shape}`` of what was written.

    Raises:
        ValueError: the folder has no model entries (the reader raises its own
            errors for missing or unsafe files).
        OSError: reading or writing failed.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    metadata = reader.read_metadata()
    entries = _model_entries(metadata, prefix)
    if not entries:
        raise ValueError(f"{folder}: no tensors under {prefix!r} in the checkpoint")
    skip = set(skip)
    state = {
        prefix + name: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for name, meta in entries.items()
        if name not in skip
    }
    with single_process_dcp():
        dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
    tensors = {}
    for key, value in state.items():
        t = value
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[key[len(prefix) :]] = t.contiguous()
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        metadata = {"format": "pt", "source": str(folder), **placeholder_metadata()}
        save_file(tensors, str(tmp), metadata=metadata)
        seal_safetensors(tmp)
    return {k: tuple(v.shape) for k, v in tensors.items()}


def load_consolidated(
    path: str | os.PathLike, model: torch.nn.Module, *, strict: bool = True
) -> None:
    """Load a file from :func:`consolidate_checkpoint` into a plain (single-process) model.

    The file's recorded checksum is verified first (a file without one, written
    before checksums, loads unverified).

    Raises:
        epochal._checksum.ChecksumError: the file is damaged (a ``ValueError`` naming it).
        RuntimeError: missing or unexpected keys with ``strict``.
    """
    from safetensors.torch import load_file

    verify_safetensors(path)
    state = load_file(str(path))
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    if strict and missing:
        raise RuntimeError(f"{path}: missing {missing}")
    model.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
