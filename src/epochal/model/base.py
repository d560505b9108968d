"""What every model of the family shares: meta-device construction, tying, initialization.

:class:`TransformerModel` is the base of :class:`~epochal.model.GPTModel` and
:class:`~epochal.model.BertModel`. A subclass implements ``_build(config)``
(creating its modules; called on the ``meta`` device) and ``forward``; the base
materializes the modules on the current default device and initializes them
(:mod:`epochal.model.init`), keeps ``output.weight`` tied to
``tok_embeddings.weight`` when the config ties them, and (re)computes the
non-persistent RoPE / ALiBi buffers. Submodules a pipeline stage does not own
are set to ``None`` (:attr:`TransformerModel.FIRST_STAGE_MODULES` /
:attr:`TransformerModel.LAST_STAGE_MODULES` name them per model class, and the
blocks it does not own are deleted from ``layers``); every method here accepts that.
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.config import ModelConfig
from epochal.model.init import initial_value
from epochal.model.layers.positions import RopeScaling, rope_cos_sin

__all__ = ["TransformerModel", "rope_tables"]


def rope_tables(
    config: ModelConfig, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE ``(cos, sin)`` of ``config``, float32 ``[max_position_embeddings, rotary_dim]``, scaled."""
    scaling = None
    if config.rope_scaling_type is not None:
        scaling = RopeScaling(
            type=config.rope_scaling_type,
            factor=config.rope_scaling_factor,
            low_freq_factor=config.rope_low_freq_factor,
            high_freq_factor=config.rope_high_freq_factor,
            original_max_positions=config.rope_original_max_position_embeddings,
        )
    # computed on the CPU and copied, so every device holds the same tables (CUDA's cos/sin
    # differ from the CPU's in the last bit)
    cos, sin = rope_cos_sin(
        config.rotary_dim,
        config.max_position_embeddings,
        config.rotary_base,
        device="cpu",
        scaling=scaling,
    )
    return cos.to(device), sin.to(device)


class TransformerModel(nn.Module):
    """Base class: builds on ``meta``, then materializes and initializes.

    Args:
        config: the model's hyper-parameters.
        seed: initialization seed (see :mod:`epochal.model.init`). Modules are
            created on the ``meta`` device, then materialized on the current
            default device (``with torch.device(...)`` selects it) and
            initialized; the global RNG is never used. Under
            ``with torch.device("meta")`` nothing is materialized: call
            ``to_empty(device=...)`` then :meth:`init_weights`.

    Subclasses set ``tok_embeddings``, ``output`` and ``layers`` (an
    ``nn.ModuleDict`` of blocks with an ``attention``) in ``_build``, and call
    :meth:`_register_rope` there.
    """

    tok_embeddings: nn.Embedding | None
    output: nn.Linear | None
    layers: nn.ModuleDict

    #: top-level modules only the first pipeline stage keeps (the others set them to None).
    FIRST_STAGE_MODULES: tuple[str, ...] = ("tok_embeddings", "pos_embeddings")
    #: top-level modules only the last pipeline stage keeps (the others set them to None).
    LAST_STAGE_MODULES: tuple[str, ...] = ("norm", "output")

    def __init__(self, config: ModelConfig, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        target = torch.empty(0).device  # honours a `with torch.device(...)` context
        with torch.device("meta"):  # no default init: no global RNG use, no wasted work
            self._build(config)
        if target.type != "meta":
            self.to_empty(device=target)
            self.init_weights(seed=seed)

    def _build(self, config: ModelConfig) -> None:  # pragma: no cover - abstract
        raise TypeError(f"{type(self).__name__} must implement _build")

    def _register_rope(self) -> None:
        """Register the non-persistent ``rope_cos`` / ``rope_sin`` buffers (``None`` without RoPE)."""
        if self.config.position_embedding_type == "rope":
            cos, sin = rope_tables(self.config)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = None
            self.rope_sin = None

    # ------------------------------------------------------------ initialization
    def tie_weights(self) -> None:
        """Make ``output.weight`` the same parameter as ``tok_embeddings.weight`` (tied configs)."""
        if (
            self.config.tie_embeddings
            and self.output is not None
            and self.tok_embeddings is not None
        ):
            self.output.weight = self.tok_embeddings.weight

    def init_buffers(self) -> None:
        """Recompute the non-persistent RoPE / ALiBi buffers on the parameters' device, and
        set an MoE layer's balancing bias and counts to zero (a checkpoint loads the bias)."""
        device = next(self.parameters()).device
        if self.config.position_embedding_type == "rope":
            self.rope_cos, self.rope_sin = rope_tables(self.config, device=device)
        for layer in self.layers.values():
            layer.attention.init_buffers()
            reset = getattr(getattr(layer, "mlp", None), "init_buffers", None)  # MoE's bias
            if reset is not None:
                reset()

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """Initialize every parameter as Megatron does (see :mod:`epochal.model.init`) and the buffers.

        Works on any device, after ``to_empty``, and on a pipeline stage (a subset
        of the modules). Same ``seed`` -> same values, whatever the device.
        """
        self.tie_weights()
        for name, param in self.named_parameters():
            value = initial_value(self.config, name, param.shape, seed=seed)
            param.copy_(value.to(device=param.device, dtype=param.dtype))
        self.init_buffers()

    # ------------------------------------------------------------------- helpers
    #: top-level modules that count as embeddings in :meth:`num_parameters`.
    EMBEDDING_MODULES: tuple[str, ...] = ("tok_embeddings", "pos_embeddings")

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Number of distinct parameters (tied weights counted once).

        Args:
            exclude_embeddings: leave out the embedding tables
                (:attr:`EMBEDDING_MODULES`; an untied ``output`` is still counted).
        """
        total = 0
        for name, p in self.named_parameters():
            if exclude_embeddings and name.split(".")[0] in self.EMBEDDING_MODULES:
                continue
            total += p.numel()
        return total
