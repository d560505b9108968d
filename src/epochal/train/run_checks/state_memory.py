"""Do the training state and the activations fit the device? Checked before any weight is allocated.

Training holds, per parameter, its float32 weight (4 bytes; bf16/fp16 runs keep
float32 weights too), and per *trainable* parameter its float32 gradient (4 bytes)
and AdamW's two float32 moments (8 bytes): :func:`state_bytes`. On top come the
activations of the step's micro-batches in flight, kept for the backward, and the
backward's own peak (:mod:`epochal.train.run_checks.activation_memory`: Megatron's
per-layer count for this trainer's layers, the precision, recompute and layout). The
run is refused when the two together exceed the free memory, with the estimate and
what lowers it (the micro-batch size, recompute, the sequence length). What is not
counted (the allocator's fragmentation, kernel workspaces) is small next to a margin
of a few percent, so a run that passes can still run short on a device filled to the
last gigabyte.

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

import dataclasses
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from epochal.model.build import build_model
from epochal.model.config import ConfigError, ModelConfig
from epochal.train.run_checks.activation_memory import activation_bytes

__all__ = [
    "activation_bytes",
    "available_memory",
    "check_state_memory",
    "parameter_counts",
    "state_bytes",
]

_GB = 1e9
#: Bytes per parameter: the weight; per trainable parameter: its gradient and AdamW's moments.
WEIGHT_BYTES, GRAD_BYTES, ADAM_BYTES = 4, 4, 8


def parameter_counts(model_config: ModelConfig) -> tuple[int, int, int]:
    """``(all, trainable, in linear weights)`` parameters of the model (built on the meta
    device: no memory; tied weights once)."""
    with torch.device("meta"):
        model = build_model(model_config)
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    weights = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)}
    return total, trainable, sum(weights.values())


def state_bytes(config: Any, model_config: ModelConfig) -> tuple[int, int, int]:
    """``(bytes per process, parameters, trainable parameters)`` of the training state.

    Args:
        config: the ``TrainConfig`` (``parallel.*`` divides the state per process).
        model_config: the resolved model.
    """
    total, trainable, _ = parameter_counts(model_config)
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


def _options(config: Any, model_config: ModelConfig, device: torch.device, weights: int) -> str:
    """What lowers the activations, each with the estimate it gives (GB)."""

    def act(**changes: Any) -> str:
        training = dataclasses.replace(config.training, **changes.pop("training", {}))
        parallel = dataclasses.replace(config.parallel, **changes.pop("parallel", {}))
        changed = dataclasses.replace(config, training=training, parallel=parallel)
        gb = activation_bytes(changed, model_config, device.type, weights).total / _GB
        return f"{gb:,.2f} GB"

    t, p = config.training, config.parallel
    parts = []
    if t.micro_batch_size > 1:
        one = act(training={"micro_batch_size": 1})
        parts.append(
            f"lower training.micro_batch_size (now {t.micro_batch_size}; at 1 the activations "
            f"need {one})"
        )
    modes = [g for g in ("selective", "full") if p.recompute_granularity in ("none", "selective")]
    modes = [g for g in modes if g != p.recompute_granularity]
    if modes:
        each = ", ".join(f"{g}: {act(parallel={'recompute_granularity': g})}" for g in modes)
        parts.append(f"recompute them (parallel.recompute_granularity={each})")
    parts.append(f"shorten data.seq_length (now {config.data.seq_length})")
    return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]


def check_state_memory(config: Any, model_config: ModelConfig, device: torch.device) -> None:
    """Refuse a run whose training state and activations cannot fit ``device``.

    The state: weights, gradients and AdamW state (:func:`state_bytes`); the
    activations: one step's micro-batches in flight, kept for the backward, and the
    backward's peak on top (:func:`~epochal.train.run_checks.activation_memory.activation_bytes`).

    Raises:
        ConfigError: (naming ``training.device``) the estimates, what to change (the
            micro-batch size, recompute, the sequence length, the model or the devices)
            and the override ``training.memory_check=false``.
    """
    if not config.training.memory_check:
        return
    room = available_memory(device)
    if room is None:
        return
    per_process, total, trainable = state_bytes(config, model_config)
    weights = parameter_counts(model_config)[2]
    activations = activation_bytes(config, model_config, device.type, weights)
    processes = _processes_sharing(device, config)
    state_need = per_process * processes
    need = (per_process + activations.total) * processes
    if need <= room[0]:
        return
    on = f", {processes} processes" if processes > 1 else ""
    state = (
        f"the model's weights, gradients and AdamW state need {state_need / _GB:,.2f} GB on the "
        f"{device.type} ({total:,} parameters, {trainable:,} trainable: {WEIGHT_BYTES} bytes "
        f"each, {GRAD_BYTES + ADAM_BYTES} more per trainable one{on})"
    )
    tokens = f"{activations.micro_batch} x {activations.seq_length} tokens"
    flight = f", {activations.in_flight} in flight" if activations.in_flight > 1 else ""
    act_gb = activations.total * processes / _GB
    acts = (
        f"the activations of a micro-batch of {tokens}{flight} need {act_gb:,.2f} GB more "
        f"({activations.stored * processes / _GB:,.2f} GB kept for the backward, "
        f"{activations.transient * processes / _GB:,.2f} GB more at its peak)"
    )
    if state_need > room[0]:
        raise ConfigError(
            "training.device",
            f"{state}, and {acts}, but only {room[0] / _GB:,.2f} GB is {room[1]}; use a smaller "
            "model, a device with more memory or more devices (parallel.*), or set "
            "training.memory_check=false to start anyway",
        )
    raise ConfigError(
        "training.device",
        f"the run needs {need / _GB:,.2f} GB on the {device.type}, but only "
        f"{room[0] / _GB:,.2f} GB is {room[1]}: {state}, and {acts}; to fit, "
        f"{_options(config, model_config, device, weights)}; or use a device with more "
        "memory or more devices (parallel.*), or set training.memory_check=false to start anyway",
    )
