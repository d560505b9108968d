"""Does the model's training state fit the device? Checked before any weight is allocated.

Training holds, per parameter, its float32 weight (4 bytes; bf16/fp16 runs keep
float32 weights too), and per *trainable* parameter its float32 gradient (4 bytes)
and AdamW's two float32 moments (8 bytes): :func:`state_bytes`. Activations come
on top and are not counted, so this is a lower bound: a run refused here could not
have trained, and a run that passes can still run out of memory in its first step.

A parallel layout divides it per process: tensor and pipeline parallelism split
the model (``tensor_parallel * pipeline_parallel`` shares); ``parallel.dp_sharding =
"optimizer"`` also splits the gradients and moments over the data-parallel ranks,
``"full"`` the weights as well. Context parallelism divides only the activations (each
rank holds ``1/context_parallel`` of every sequence), not the state: its ranks each hold
the whole model share. Processes of one machine share its RAM (on the CPU),
each GPU is its own device.

Available memory (:func:`available_memory`): on CUDA the device's free memory
(``torch.cuda.mem_get_info``); on the CPU ``MemAvailable`` of ``/proc/meminfo``
(``psutil`` where there is no such file), lowered to what a cgroup memory limit
leaves (containers). Unknown: nothing is checked.

``training.memory_check = false`` skips the check (a machine that swaps, or
memory freed by then).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from epochal.model.build import build_model
from epochal.model.config import ConfigError, ModelConfig

__all__ = ["available_memory", "check_state_memory", "state_bytes"]

_GB = 1e9
#: Bytes per parameter: the weight; per trainable parameter: its gradient and AdamW's moments.
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8


def _parameter_counts(model_config: ModelConfig) -> tuple[int, int]:
    """``(all, trainable)`` parameters of the model (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = build_model(model_config)
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():  # tied weights once
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def state_bytes(config: Any, model_config: ModelConfig) -> tuple[int, int, int]:
    """``(bytes per process, parameters, trainable parameters)`` of the training state.

    Args:
        config: the ``TrainConfig`` (``parallel.*`` divides the state per process).
        model_config: the resolved model.
    """
    total, trainable = _parameter_counts(model_config)
    p = config.parallel
    model_shares = p.tensor_parallel * p.pipeline_parallel
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = p.data_parallel or max(1, world // model_shares)
    weights = WEIGHT_BYTES * total / model_shares
    rest = (GRAD_BYTES + ADAM_BYTES) * trainable / model_shares
    if p.dp_sharding in ("optimizer", "full"):
        rest /= dp
    if p.dp_sharding == "full":
        weights /= dp
    return int(weights + rest), total, trainable


def _cgroup_room() -> int | None:
    """Bytes a cgroup v2 memory limit still leaves this process's group, or None (no limit)."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` of ``path`` in bytes, or None."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """``(bytes, what)`` this run can still allocate on ``device``, or None if unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {torch.cuda.get_device_name(device)}"
    found = _meminfo_available()
    what = "available RAM (MemAvailable)"
    if found is None:
        try:
            import psutil

            found, what = int(psutil.virtual_memory().available), "available RAM"
        except ImportError:
            return None
    room = _cgroup_room()
    if room is not None and room < found:
        return room, "left under this container's memory limit"
    return found, what


def _processes_sharing(device: torch.device, config: Any) -> int:
    """Processes of this machine whose state shares ``device``'s memory (CPU: all local ones)."""
    if device.type == "cuda":
        return 1
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is not None and local.isdigit():
        return max(1, int(local))
    return config.parallel.launch_world_size()


def check_state_memory(config: Any, model_config: ModelConfig, device: torch.device) -> None:
    """Refuse a run whose weights, gradients and AdamW state cannot fit ``device``.

    Raises:
        ConfigError: (naming ``training.device``) the two numbers, what to change and
            the override ``training.memory_check=false``.
    """
    if not config.training.memory_check:
        return
    room = available_memory(device)
    if room is None:
        return
    per_process, total, trainable = state_bytes(config, model_config)
    processes = _processes_sharing(device, config)
    need = per_process * processes
    if need <= room[0]:
        return
    on = f", {processes} processes" if processes > 1 else ""
    raise ConfigError(
        "training.device",
        f"the model's weights, gradients and AdamW state need {need / _GB:,.2f} GB on the "
        f"{device.type} ({total:,} parameters, {trainable:,} trainable: {WEIGHT_BYTES} bytes "
        f"each, {GRAD_BYTES + ADAM_BYTES} more per trainable one{on}), but only "
        f"{room[0] / _GB:,.2f} GB is {room[1]}; use a smaller model, a device with more "
        "memory or more devices (parallel.*), or set training.memory_check=false to start anyway",
    )
