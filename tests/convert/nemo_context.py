"""Stand-ins for NeMo 2's context classes, to write a real Fiddle ``io.json`` in tests.

NeMo's ``TrainerContext.io_dump`` serializes ``fdl.Config(TrainerContext, model=
fdl.Config(LlamaModel, config=fdl.Config(LlamaConfig, ...), ...), trainer=...)`` with
Fiddle's ``dump_json``; these classes take the same arguments so that the real Fiddle
library writes the same graph (only the class paths differ: they point here).
"""

from __future__ import annotations

from typing import Any


class LlamaConfig:
    """NeMo's ``llm.LlamaConfig`` (Megatron-Core ``TransformerConfig`` fields as keywords)."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields


class LlamaModel:
    """NeMo's ``llm.LlamaModel(config, tokenizer=None)``."""

    def __init__(self, config: Any, tokenizer: Any = None) -> None:
        self.config, self.tokenizer = config, tokenizer


class Trainer:
    """Lightning's trainer, as far as the context records it."""

    def __init__(self, devices: int = 1, max_steps: int = -1) -> None:
        self.devices, self.max_steps = devices, max_steps


class TrainerContext:
    """NeMo's ``io.TrainerContext(model, trainer, extra)``."""

    def __init__(self, model: Any, trainer: Any, extra: Any = None) -> None:
        self.model, self.trainer, self.extra = model, trainer, extra


def io_json(fields: dict[str, Any]) -> str:
    """``context/io.json`` as NeMo writes it for a Llama model with ``fields``."""
    import fiddle as fdl
    import torch
    from fiddle._src.experimental import serialization

    fields = dict(fields)
    if fields.get("activation_func") == "silu":
        fields["activation_func"] = torch.nn.functional.silu
    context = fdl.Config(
        TrainerContext,
        model=fdl.Config(LlamaModel, config=fdl.Config(LlamaConfig, **fields)),
        trainer=fdl.Config(Trainer, devices=2, max_steps=100),
        extra={"datamodule": None},
    )
    return serialization.dump_json(context)
