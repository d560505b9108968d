"""A micro-batch as the trainer hands it to a train step: its tensors on the device, a loss mask."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["batch_on_device"]


def batch_on_device(micro_batch: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of ``micro_batch`` on ``device`` (other values dropped), with a ``loss_mask``.

    A batch without ``loss_mask`` gets float32 ones shaped like its ``labels``.
    """
    out = {}
    for key, value in micro_batch.items():
        if isinstance(value, torch.Tensor):
            out[key] = value.to(device, non_blocking=True)
    if "loss_mask" not in out:
        out["loss_mask"] = torch.ones_like(out["labels"], dtype=torch.float32)
    return out
