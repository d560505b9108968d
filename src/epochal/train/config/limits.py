"""Sizes checked before anything is allocated: sequence lengths against positions and memory.

:func:`check_sizes` runs in ``epochal train``'s preflight (before any data is
prepared, any process launched or any tensor allocated):

- **Positions.** The sequence lengths (``data.seq_length``; T5 also
  ``data.seq_length_decoder``) must fit the model's position table: the
  configured ``model.max_position_embeddings`` (checked by the config tree) or
  that of the checkpoint ``checkpoint.init_from`` names (its
  ``trainer_state.json`` records the resolved model).
- **Attention memory.** Models that build ``[s, s_k]`` masks or biases (BERT and
  ESM's padding masks, T5's relative bias, ALiBi, per-document masks) hold at least
  ``micro_batch_size * heads * s * s_k`` float32 scores per attention on CPU
  (one bias per micro-batch, ``heads = 1``, on CUDA, where SDPA broadcasts it): one
  micro-batch whose estimate exceeds the device's whole memory is refused naming
  the sequence-length options, the micro-batch size and both numbers. Plain
  causal attention (``is_causal``) builds no such tensor and is not bounded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from epochal.model.config import ConfigError

__all__ = ["attention_bytes", "check_sizes", "device_memory_bytes"]


def device_memory_bytes(device_name: str) -> tuple[int, str] | None:
    """``(bytes, description)`` of the memory one process trains in, or None if unknown."""
    import torch

    if device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(0).total_memory, "GPU memory"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"
    except (ValueError, OSError, AttributeError):
        return None


def _materializes_masks(config: Any) -> bool:
    m = config.model
    return (
        m.type in ("bert", "esm", "t5")
        or getattr(m, "position_embedding_type", None) in ("alibi", "relative")
        or config.per_document_attention
    )


def attention_bytes(config: Any, *, on_cuda: bool) -> tuple[int, str]:
    """The largest attention score/mask tensor of one micro-batch, in bytes, and what it is."""
    d, b = config.data, config.training.micro_batch_size
    heads = 1 if on_cuda else config.model.num_attention_heads
    shapes = [(d.seq_length, d.seq_length, "data.seq_length")]
    if config.model.type == "t5":
        s_dec = d.seq_length_decoder
        shapes += [
            (s_dec, s_dec, "data.seq_length_decoder"),
            (s_dec, d.seq_length, "data.seq_length_decoder x data.seq_length"),
        ]
    s, s_k, what = max(shapes, key=lambda x: x[0] * x[1])
    return b * heads * s * s_k * 4, what


def _checkpoint_positions(path: str) -> tuple[int, str] | None:
    """``(max_position_embeddings, file)`` recorded by the checkpoint at ``path``, if any."""
    from epochal.train.state.checkpoint import Checkpointer

    p = Path(path)
    folder = p if (p / "trainer_state.json").is_file() else None
    for candidate in (p, p / "checkpoints"):
        if folder is None and candidate.is_dir():
            folder = Checkpointer(candidate).latest()
    if folder is None:
        return None
    state_file = folder / "trainer_state.json"
    try:
        recorded = json.loads(state_file.read_text()).get("model_config") or {}
    except (OSError, ValueError, AttributeError):
        return None
    positions = recorded.get("max_position_embeddings") if isinstance(recorded, dict) else None
    return (positions, str(state_file)) if isinstance(positions, int) else None


def check_sizes(config: Any) -> None:
    """Refuse sequence lengths beyond the model's positions or the device's memory.

    Raises:
        ConfigError: naming the sequence-length option and the limit (the
            checkpoint's file, or the memory and the estimate).
    """
    from epochal.train.config.model import position_length

    longest = position_length(config)
    lengths = f"data.seq_length={config.data.seq_length}" + (
        f" / data.seq_length_decoder={config.data.seq_length_decoder}"
        if config.model.type == "t5"
        else ""
    )
    if config.checkpoint.init_from and config.model.max_position_embeddings is None:
        found = _checkpoint_positions(config.checkpoint.init_from)
        if found is not None and found[0] < longest:
            raise ConfigError(
                "data.seq_length",
                f"{lengths} exceeds the {found[0]} positions of the model in "
                f"checkpoint.init_from ({found[1]}: model.max_position_embeddings={found[0]})",
            )
    if not _materializes_masks(config):
        return
    memory = device_memory_bytes(config.training.device)
    if memory is None:
        return
    on_cuda = memory[1] == "GPU memory"
    need, what = attention_bytes(config, on_cuda=on_cuda)
    if need > memory[0]:
        option = (
            "data.seq_length_decoder"
            if what.startswith("data.seq_length_decoder")
            else ("data.seq_length")
        )
        raise ConfigError(
            option,
            f"{lengths}: one micro-batch's attention scores ({what}, "
            f"training.micro_batch_size={config.training.micro_batch_size}) need about "
            f"{need / 2**30:,.0f} GiB, more than this machine's {memory[0] / 2**30:,.0f} GiB "
            f"of {memory[1]}; use shorter sequences",
        )
