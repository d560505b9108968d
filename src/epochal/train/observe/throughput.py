"""How well the hardware is used: tokens/s, MFU and peak memory per step, and the run's summary.

MFU (model FLOPs utilization, PaLM appendix B) is the model's training FLOPs per
second over the device's peak: ``tokens_per_s * training_flops_per_token / peak``,
with FLOPs per token from :func:`epochal.model.flops.training_flops_per_token`
(no recompute counted: recomputation lowers MFU, as in the PaLM paper). The peak is
``logging.peak_tflops`` when set, else the dense bfloat16 tensor-core peak of the
detected GPU from :data:`PEAK_BF16_TFLOPS` (matched on the CUDA device name); on
the CPU, or on an unknown GPU, MFU is omitted unless ``logging.peak_tflops`` is set.
MFU is always against that bfloat16 peak, whatever ``training.bf16``/``fp16`` say.

Memory (fields of every ``metrics.jsonl`` train record, since the start of the process):

- CUDA: ``mem_peak_allocated_gib`` / ``mem_peak_reserved_gib``
  (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``) and their share of
  the device's memory, ``mem_peak_allocated_pct`` / ``mem_peak_reserved_pct``;
- CPU: ``mem_peak_rss_gib`` (the process's peak resident set size) and
  ``mem_peak_rss_pct`` of the machine's physical memory.

None of these synchronizes with the device.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import torch

from epochal._text import plural
from epochal.model.config import ModelConfig
from epochal.model.flops import training_flops_per_token

__all__ = [
    "PEAK_BF16_TFLOPS",
    "ThroughputMeter",
    "attention_backend",
    "device_name",
    "memory_fields",
    "peak_tflops",
]

#: Dense bfloat16 peak TFLOP/s by CUDA device-name fragment (first match wins; vendor sheets).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM / HBM3
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("RTX 4090", 165.0),
    ("RTX 3090", 71.0),
    ("V100", 125.0),  # float16 tensor cores (no bfloat16)
    ("T4", 65.0),  # float16 tensor cores (no bfloat16)
)

_GIB = 1024.0**3


def device_name(device: torch.device) -> str:
    """``"NVIDIA H100 80GB HBM3"`` for a CUDA device, ``"cpu"`` (with the core count) else."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({plural(torch.get_num_threads(), 'thread')})"


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """The device's dense bf16 peak in TFLOP/s: ``override`` if set, else from the table.

    Returns:
        None on the CPU and on GPUs missing from :data:`PEAK_BF16_TFLOPS` (without override).
    """
    if override is not None:
        return float(override)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, tflops in PEAK_BF16_TFLOPS:
        if fragment in name:
            return tflops
    return None


def attention_backend(device: torch.device, choice: str = "auto") -> str:
    """A short description of the scaled-dot-product attention kernels in use.

    Args:
        device: the training device.
        choice: ``training.attention_backend`` (``auto`` = PyTorch's own choice).
    """
    if choice != "auto":
        return f"sdpa[{choice}]"
    if device.type != "cuda":
        return "sdpa[auto: cpu flash/math]"
    b = torch.backends.cuda
    enabled = [
        name
        for name, on in (
            ("cudnn", b.cudnn_sdp_enabled()),
            ("flash", b.flash_sdp_enabled()),
            ("efficient", b.mem_efficient_sdp_enabled()),
            ("math", b.math_sdp_enabled()),
        )
        if on
    ]
    return f"sdpa[auto: {'/'.join(enabled)}]"


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_fields(device: torch.device) -> dict[str, float]:
    """Peak memory since the process started (see the module docstring for the fields)."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        allocated = torch.cuda.max_memory_allocated(device)
        reserved = torch.cuda.max_memory_reserved(device)
        return {
            "mem_peak_allocated_gib": allocated / _GIB,
            "mem_peak_reserved_gib": reserved / _GIB,
            "mem_peak_allocated_pct": 100.0 * allocated / total,
            "mem_peak_reserved_pct": 100.0 * reserved / total,
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rss = rss_kib * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux
    out = {"mem_peak_rss_gib": rss / _GIB}
    physical = _physical_memory_bytes()
    if physical:
        out["mem_peak_rss_pct"] = 100.0 * rss / physical
    return out


class ThroughputMeter:
    """Per-step throughput fields of the train records and the run's summary.

    Args:
        model_config: the model (FLOPs per token).
        seq_length: tokens per sample (``data.seq_length``).
        device: the training device.
        peak_tflops_override: ``logging.peak_tflops`` (None = from the device).
        dtype: ``"bf16"``, ``"fp16"`` or ``"fp32"`` (for the summary).
        attention: the attention backend's description (for the summary).
        num_devices: devices the step's tokens are spread over (MFU is per device:
            the world size under parallelism).
    """

    def __init__(
        self,
        model_config: ModelConfig,
        seq_length: int,
        device: torch.device,
        *,
        peak_tflops_override: float | None = None,
        dtype: str = "fp32",
        attention: str = "sdpa",
        num_devices: int = 1,
    ) -> None:
        self.device = device
        self.num_devices = max(1, int(num_devices))
        self.flops_per_token = training_flops_per_token(model_config, seq_length)
        self.peak_tflops = peak_tflops(device, peak_tflops_override)
        self.dtype = dtype
        self.attention = attention

    @classmethod
    def from_config(
        cls, config: Any, model_config: ModelConfig, device: torch.device, *, num_devices: int = 1
    ) -> ThroughputMeter:
        """The meter of a ``TrainConfig`` (``data.seq_length``, ``logging.peak_tflops``, precision)."""
        t = config.training
        return cls(
            model_config,
            config.data.seq_length,
            device,
            peak_tflops_override=config.logging.peak_tflops,
            dtype="bf16" if t.bf16 else "fp16" if t.fp16 else "fp32",
            attention=attention_backend(device, t.attention_backend),
            num_devices=num_devices,
        )

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilization (a fraction, 0..1) at ``tokens_per_s`` (all devices); None without a peak."""
        if self.peak_tflops is None or self.peak_tflops <= 0:
            return None
        per_device = tokens_per_s / self.num_devices
        return per_device * self.flops_per_token / (self.peak_tflops * 1e12)

    def step_fields(self, tokens: int, seconds: float) -> dict[str, Any]:
        """``tokens_per_s``, ``tflops`` (achieved model TFLOP/s), ``mfu`` (if a peak) and memory."""
        rate = tokens / seconds if seconds > 0 else 0.0
        out: dict[str, Any] = {
            "tokens_per_s": rate,
            "tflops": rate * self.flops_per_token / 1e12,
        }
        mfu = self.mfu(rate)
        if mfu is not None:
            out["mfu"] = mfu
        out.update(memory_fields(self.device))
        return out

    def describe(self) -> str:
        """``"<device name>, <dtype>, <attention>[, peak N TFLOP/s]"`` for the summary line."""
        peak = f", peak {self.peak_tflops:g} TFLOP/s" if self.peak_tflops else ""
        return f"{device_name(self.device)}, {self.dtype}, {self.attention}{peak}"

    def summary(self, tokens_per_s: float) -> str:
        """The run's utilization: ``"MFU 49.7%, peak memory 43.5 GiB (54%)"`` (parts omitted when unknown)."""
        parts = []
        mfu = self.mfu(tokens_per_s)
        if mfu is not None:
            parts.append(f"MFU {100 * mfu:.1f}%")
        mem = memory_fields(self.device)
        if "mem_peak_allocated_gib" in mem:
            parts.append(
                f"peak memory {mem['mem_peak_allocated_gib']:.1f} GiB allocated "
                f"({mem['mem_peak_allocated_pct']:.0f}%), {mem['mem_peak_reserved_gib']:.1f} GiB reserved"
            )
        else:
            pct = f" ({mem['mem_peak_rss_pct']:.0f}%)" if "mem_peak_rss_pct" in mem else ""
            parts.append(f"peak RSS {mem['mem_peak_rss_gib']:.2f} GiB{pct}")
        return ", ".join(parts)
