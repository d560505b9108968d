"""``DistributedType`` and the accelerator's state: where this process sits and how it trains.

An epochal ``Accelerator`` always runs in ``DistributedType.MEGATRON_LM`` mode, in
one process as under ``epochal launch`` / ``torchrun``, so a script's Megatron
branches (``MegatronLMDummyScheduler``, ``megatron_lm_plugin.global_batch_size``,
losses already averaged over data-parallel ranks) are the ones taken.

Environment (set by ``epochal launch`` from Accelerate's YAML, as ``accelerate
launch`` does): ``ACCELERATE_MIXED_PRECISION`` (``no``/``fp16``/``bf16``),
``ACCELERATE_USE_CPU``, ``MEGATRON_LM_*`` (:mod:`epochal.accelerate.plugin`);
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` from ``torchrun``.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

from epochal.accelerate.plugin import MegatronLMPlugin

__all__ = ["MIXED_PRECISION", "AcceleratorError", "AcceleratorState", "DistributedType"]


class AcceleratorError(RuntimeError):
    """Something an epochal-backed ``Accelerator`` cannot do (the message says what to use)."""


MIXED_PRECISION = ("no", "fp16", "bf16")


class DistributedType(enum.StrEnum):
    """Accelerate's distributed types (compare with ``==``, as strings or members)."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"


@dataclass
class AcceleratorState:
    """What ``accelerator.state`` reports.

    Attributes:
        num_processes: the world size.
        process_index: this process's global rank.
        local_process_index: its rank on this machine.
        device: its device.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        megatron_lm_plugin: the layout and training options.
        backend: the process-group backend (``"gloo"``, ``"nccl"``, or None in one process).
        megatron_lm: a Megatron-LM plugin was asked for (given to ``Accelerator``, or
            ``ACCELERATE_USE_MEGATRON_LM=true`` from the launcher): the train step is
            Megatron's, clipping included; False: a plain Accelerate loop, which clips
            only through ``clip_grad_norm_`` (:mod:`epochal.accelerate.engine`).
    """

    num_processes: int
    process_index: int
    local_process_index: int
    device: torch.device
    mixed_precision: str
    megatron_lm_plugin: MegatronLMPlugin
    backend: str | None = None
    megatron_lm: bool = True

    @property
    def deepspeed_plugin(self) -> None:
        """``None``: no DeepSpeed (as Accelerate without DeepSpeed)."""
        return None

    @property
    def distributed_type(self) -> DistributedType:
        """Always ``DistributedType.MEGATRON_LM``."""
        return DistributedType.MEGATRON_LM

    @property
    def is_main_process(self) -> bool:
        """Global rank 0."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Rank 0 of this machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """The highest global rank."""
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        """More than one process."""
        return self.num_processes > 1

    def __repr__(self) -> str:
        return (
            f"Distributed environment: {self.distributed_type.value}"
            f"  Backend: {self.backend or 'none (one process)'}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n\n"
            f"Mixed precision type: {self.mixed_precision}\n"
        )


def mixed_precision_from(value: str | None) -> str:
    """The mixed precision from the argument, else ``ACCELERATE_MIXED_PRECISION``, else ``"no"``.

    Raises:
        ValueError: not one of :data:`MIXED_PRECISION` (``fp8`` included: epochal has no FP8).
    """
    chosen = value if value is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    chosen = str(chosen).lower()
    if chosen not in MIXED_PRECISION:
        raise ValueError(
            f"mixed_precision must be one of {MIXED_PRECISION}, got {chosen!r}"
            + (" (epochal has no FP8 training)" if chosen == "fp8" else "")
        )
    return chosen
