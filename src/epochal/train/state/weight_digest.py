"""A digest of a model's weights that names the same values on every layout.

Each checkpoint's ``trainer_state.json`` records ``"weight_digest"``: 16 hex
digits (SHA-256) over every tensor of the model's state dict, in name order, each
as its name, dtype, shape and bytes. A tensor split by tensor parallelism or
sharded over the data-parallel ranks (a DTensor) is hashed whole
(``full_tensor()``, one tensor at a time, so the extra memory is the largest
tensor's); the tensors of other pipeline stages and other expert-parallel ranks
are hashed where they live and the per-tensor digests gathered to every rank.
Two runs whose weights are equal bit for bit therefore record the same digest
whatever their layouts, which is what ``epochal replay`` compares a replayed
step's weights with.

Cost: one read of every weight (SHA-256 runs at about 1 GB/s per core), plus a
gather of each tensor-parallel tensor, per checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.train.state.model_state import ModelState

__all__ = ["KEY", "tensor_digest", "weight_digest"]

KEY = "weight_digest"


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """SHA-256 (hex) of ``name``, dtype, shape and the bytes of ``tensor`` (whole, on the CPU)."""
    h = hashlib.sha256(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    flat = tensor.detach().contiguous().cpu().reshape(-1)
    h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()


def weight_digest(model_parts: Sequence[nn.Module]) -> str:
    """The layout-free digest (16 hex digits) of ``model_parts``' state dicts.

    Collective when ``torch.distributed`` is initialized with several ranks:
    every rank calls it (as every rank saves a checkpoint). Where two ranks hold
    a tensor of the same name (data-parallel replicas), the lowest rank's counts.
    """
    own: dict[str, str] = {}
    for name, value in sorted(ModelState(model_parts).state_dict().items()):
        if not isinstance(value, torch.Tensor):
            continue
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        own[name] = tensor_digest(name, whole)
    merged = dict(own)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[dict[str, str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, own)
        merged = {}
        for entries in gathered:
            for name, digest in (entries or {}).items():
                merged.setdefault(name, digest)
    total = hashlib.sha256()
    for name in sorted(merged):
        total.update(f"{name}={merged[name]}\n".encode())
    return total.hexdigest()[:16]
