"""The files of a Hugging Face model folder: ``config.json`` and the weights' tensors.

:func:`read_weights` reads ``model.safetensors``, a sharded ``model.safetensors.index.json``
or ``pytorch_model.bin`` (loaded with ``weights_only=True``, every shard confined to the
folder); :func:`tensor_names` lists the tensors from the safetensors header or the index
without reading them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from epochal._paths import confined_path
from epochal.formats.bounded_parse import load_json_file
from epochal.formats.common import ConversionError
from epochal.formats.safe_load import load_safetensors, safe_torch_load

__all__ = ["read_json", "read_weights", "tensor_names"]


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file read within :mod:`epochal.formats.bounded_parse`'s limits."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (not a Hugging Face model folder?)")
    return load_json_file(path, path.name)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weights by its Hugging Face name (CPU).

    Raises:
        FileNotFoundError: no weights file.
        ConversionError: an index without ``weight_map``, a shard that is no state dict, a
            tensor the index lists but no shard holds, or entries that are not named tensors.
        UnsafeCheckpointError: a ``.bin`` file holds non-tensor objects.
    """
    single = folder / "model.safetensors"
    if single.is_file():
        return _tensors_only(load_safetensors(single), single)
    for index_name, loader in (
        ("model.safetensors.index.json", load_safetensors),
        ("pytorch_model.bin.index.json", safe_torch_load),
    ):
        index = folder / index_name
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ConversionError(f"{index}: has no 'weight_map' object")
            # every shard name confined to the folder before any shard is opened
            shards = {confined_path(folder, name, str(index)) for name in weight_map.values()}
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(shards):
                part = loader(shard)
                if not isinstance(part, dict):
                    raise ConversionError(f"{shard}: expected a state dict")
                state.update(_tensors_only(part, shard))
            missing = sorted(set(weight_map) - set(state))
            if missing:
                raise ConversionError(
                    f"{index}: tensors listed but not found in the shards: {missing[:8]}"
                )
            return state
    binary = folder / "pytorch_model.bin"
    if binary.is_file():
        state = safe_torch_load(binary)
        if not isinstance(state, dict):
            raise ConversionError(f"{binary}: expected a state dict")
        return _tensors_only(state, binary)
    raise FileNotFoundError(
        f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    )


def _tensors_only(state: dict[Any, Any], source: Path) -> dict[str, torch.Tensor]:
    bad = [k for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise ConversionError(
            f"{source}: entries that are not named tensors: {[str(k) for k in bad[:8]]}"
        )
    return state


def tensor_names(folder: Path) -> set[str] | None:
    """The names of the folder's tensors, read from the safetensors header or the index
    alone; None when only reading the weights tells (a ``pytorch_model.bin``, a file that
    cannot be opened: :func:`read_weights` then reports it)."""
    from safetensors import SafetensorError, safe_open

    single = folder / "model.safetensors"
    if single.is_file():
        try:
            with safe_open(str(single), framework="pt") as f:
                return set(f.keys())
        except (SafetensorError, OSError, ValueError):
            return None
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = folder / index_name
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            return set(weight_map) if isinstance(weight_map, dict) else None
    return None
