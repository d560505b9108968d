"""LoRA: low-rank adapters on an encoder's projections (Hu et al. 2021; PEFT's ``LoraConfig``).

With ``ModelConfig.lora_rank = r > 0`` every block's projections named by
``lora_target_modules`` (``wq``, ``wk``, ``wv``, ``wo``, ``fc1``, ``fc2``) become
:class:`LoRALinear`: the frozen ``nn.Linear`` (same ``weight`` / ``bias`` names, so a
pretrained checkpoint loads unchanged) plus ``lora_a`` ``[r, in]`` and ``lora_b``
``[out, r]``::

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T

``lora_b`` starts at zero (:mod:`epochal.model.init`), so a fresh adapter model
computes what the encoder computes. :func:`merge_lora_state` folds the adapters into
the weights (``W + (alpha / r) B A``): a plain checkpoint / Hugging Face export.
Only adapters and the head are trained (:func:`trainable`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from epochal.model.config import ModelConfig

__all__ = [
    "LoRALinear",
    "apply_lora",
    "is_lora_name",
    "merge_lora_state",
    "parameter_counts",
    "trainable",
]

#: projection name -> its path inside a block.
_PATHS = {
    "wq": "attention.wq",
    "wk": "attention.wk",
    "wv": "attention.wv",
    "wo": "attention.wo",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}


class LoRALinear(nn.Linear):
    """``nn.Linear`` with a low-rank update (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        rank: int,
        alpha: float,
        dropout: float,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device)
        self.lora_a = nn.Parameter(torch.empty(rank, in_features, device=device))
        self.lora_b = nn.Parameter(torch.empty(out_features, rank, device=device))
        self.scaling = alpha / rank
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in] -> [..., out]``."""
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_a), self.lora_b)
        return super().forward(x) + self.scaling * update


def apply_lora(layers: nn.ModuleDict, config: ModelConfig) -> None:
    """Replace the target projections of every block in ``layers`` by :class:`LoRALinear` (in place)."""
    for block in layers.values():
        for target in config.lora_targets:
            parent_path, _, name = _PATHS[target].rpartition(".")
            parent = block.get_submodule(parent_path)
            old = getattr(parent, name)
            new = LoRALinear(
                old.in_features,
                old.out_features,
                bias=old.bias is not None,
                rank=config.lora_rank,
                alpha=config.lora_alpha,
                dropout=config.lora_dropout,
                device=old.weight.device,
            )
            setattr(parent, name, new)


def is_lora_name(name: str) -> bool:
    """Whether parameter ``name`` is an adapter (``...lora_a`` / ``...lora_b``)."""
    return name.rsplit(".", 1)[-1] in ("lora_a", "lora_b")


def trainable(name: str, config: ModelConfig) -> bool:
    """Whether parameter ``name`` trains: the head and adapters always; the encoder unless frozen."""
    if name.startswith("head.") or is_lora_name(name):
        return True
    return not (config.freeze_encoder or config.lora_rank > 0)


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """``(trainable, all)`` parameters of ``model``, tied weights counted once.

    Trainable ones have ``requires_grad``; PEFT's ``get_nb_trainable_parameters``
    counts the same way (works on the ``meta`` device).
    """
    trainable_count = total = 0
    for _, param in model.named_parameters():
        total += param.numel()
        if param.requires_grad:
            trainable_count += param.numel()
    return trainable_count, total


def merge_lora_state(
    state: Mapping[str, torch.Tensor], config: ModelConfig
) -> dict[str, torch.Tensor]:
    """Fold the adapters into their weights: ``W + (alpha / r) B A``; adapter tensors dropped.

    Args:
        state: a model state dict with ``<proj>.lora_a`` / ``<proj>.lora_b`` entries.
        config: the adapter model's config (``lora_alpha``, ``lora_rank``).

    Returns:
        A state dict without adapters (float32 merge, stored in the weight's dtype).
    """
    scaling = config.lora_alpha / config.lora_rank
    out = {k: v for k, v in state.items() if not is_lora_name(k)}
    for key in state:
        if key.endswith(".lora_a"):
            prefix = key[: -len(".lora_a")]
            w = out[f"{prefix}.weight"]
            delta = state[f"{prefix}.lora_b"].float() @ state[key].float()
            out[f"{prefix}.weight"] = (w.float() + scaling * delta).to(w.dtype)
    return out
