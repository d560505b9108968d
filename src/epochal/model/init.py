"""Megatron-style parameter initialization, reproducible per parameter.

Rules (Megatron-LM's ``init_method_normal`` / ``scaled_init_method_normal``):

- every weight matrix and embedding: ``normal(0, init_method_std)``;
- output projections of each block (``attention.wo``, ``mlp.fc2``, ``mlp.w2``, and an
  MoE block's experts' and shared expert's ``w2`` / ``fc2``):
  ``normal(0, init_method_std / sqrt(2 * num_layers))``;
- every bias: 0; norm weights: 1; LoRA's ``lora_b``: 0 (an adapter starts as no change).

Each parameter's values are drawn on the CPU from its own generator, seeded by
``(seed, canonical name)``, then copied to the parameter's device. So the same
seed gives the same weights on any device, in any parameter order, and for any
pipeline split (a stage holding ``layers.5`` draws what the full model draws).
:func:`initial_value` returns the full (unsharded) tensor, for plans that shard
parameters after initialization.

Canonical names are the plain model's FQNs with wrapper components removed
(any path component starting with ``_``, e.g. ``_orig_mod`` of
``torch.compile`` or ``_checkpoint_wrapped_module``); a tied ``output.weight``
uses ``tok_embeddings.weight``'s stream.
"""

from __future__ import annotations

import hashlib
import math

import torch

from epochal.model.config import ModelConfig

__all__ = ["canonical_name", "init_std", "initial_value", "param_seed"]

_SCALED_OUTPUT = ("attention.wo.weight", "mlp.fc2.weight", "mlp.w2.weight")


def canonical_name(fqn: str, config: ModelConfig | None = None) -> str:
    """Strip wrapper components (``_orig_mod``, ...) from ``fqn``; map a tied output weight."""
    name = ".".join(part for part in fqn.split(".") if not part.startswith("_"))
    if config is not None and config.tie_embeddings and name == "output.weight":
        return "tok_embeddings.weight"
    return name


def init_std(config: ModelConfig, fqn: str) -> float | None:
    """Standard deviation for parameter ``fqn``, or ``None`` if it is a constant (bias / norm).

    Returns:
        The std of its normal init; ``None`` for biases (0) and norm weights (1).
    """
    name = canonical_name(fqn, config)
    if name.endswith(".bias") or name.endswith(".lora_b"):
        return None
    if _is_norm_weight(name):
        return None
    if name.endswith(_SCALED_OUTPUT) or _is_expert_output(name):
        return config.init_method_std / math.sqrt(2.0 * config.num_layers)
    return config.init_method_std


def param_seed(seed: int, fqn: str) -> int:
    """A 63-bit generator seed derived from ``(seed, fqn)`` (stable across runs and platforms)."""
    digest = hashlib.sha256(f"{int(seed)}/{fqn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def initial_value(
    config: ModelConfig, fqn: str, shape: torch.Size | tuple[int, ...], seed: int = 0
) -> torch.Tensor:
    """The full initial value of parameter ``fqn``: float32 CPU tensor of ``shape``.

    Always on the CPU, whatever the default device (``with torch.device(...)``):
    callers copy it to the parameter's device, so every device gets the same values.

    Args:
        config: the model config (``init_method_std``, ``num_layers``, tying).
        fqn: the parameter's name in the model (wrappers allowed).
        shape: its full (unsharded) shape.
        seed: the run's seed.
    """
    name = canonical_name(fqn, config)
    std = init_std(config, name)
    if std is None:
        fill = 0.0 if name.endswith((".bias", ".lora_b")) else 1.0
        return torch.full(tuple(shape), fill, dtype=torch.float32, device="cpu")
    gen = torch.Generator(device="cpu").manual_seed(param_seed(seed, name))
    # device="cpu" explicitly: under `with torch.device("cuda")` (the trainer builds its
    # model so) a bare torch.empty would land on the GPU and refuse the CPU generator.
    value = torch.empty(tuple(shape), dtype=torch.float32, device="cpu")
    return value.normal_(0.0, std, generator=gen)


def _is_expert_output(name: str) -> bool:
    """An MoE expert's (or shared expert's) output projection ``mlp.experts.{e}.w2.weight``."""
    parts = name.split(".")
    return (
        len(parts) >= 3
        and parts[-1] == "weight"
        and parts[-2] in ("w2", "fc2")
        and ("experts" in parts or "shared_expert" in parts)
    )


def _is_norm_weight(name: str) -> bool:
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and parts[-2].endswith("norm")
