"""The ``[model]`` section (ModelConfig's fields) and the sequence length the model must cover."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from typing import Any

from epochal.model.config import HEAD_FIELDS, ConfigError, ModelConfig

__all__ = [
    "CHECKPOINT_KEPT_FIELDS",
    "ModelSection",
    "model_config_from_section",
    "position_length",
]


#: ``[model]`` fields a run starting from ``checkpoint.init_from`` sets itself (the head,
#: LoRA and the dropouts); the others come from the checkpoint.
CHECKPOINT_KEPT_FIELDS: tuple[str, ...] = (*HEAD_FIELDS, "hidden_dropout", "attention_dropout")


# ----------------------------------------------------------------------- model
def _model_section_fields() -> list[tuple[str, Any, Any]]:
    hints = typing.get_type_hints(ModelConfig)
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("vocab_size", "max_position_embeddings"):
            out.append((f.name, int | None, field(default=None)))
        else:
            out.append((f.name, hints[f.name], field(default=f.default)))
    return out


ModelSection = dataclasses.make_dataclass("ModelSection", _model_section_fields(), kw_only=True)
ModelSection.__module__ = __name__
ModelSection.__doc__ = """The ``[model]`` section: the fields of :class:`epochal.model.ModelConfig`.

``vocab_size`` defaults to the tokenizer's vocabulary size and
``max_position_embeddings`` to ``data.seq_length``; every other field has
ModelConfig's meaning and default. Validated as a whole by :class:`TrainConfig`.
"""


def model_config_from_section(section: Any, *, vocab_size: int, seq_length: int) -> ModelConfig:
    """Resolve a :class:`ModelSection` into a :class:`ModelConfig`.

    Args:
        section: the ``[model]`` section.
        vocab_size: the tokenizer's vocabulary size (used when ``model.vocab_size`` is unset).
        seq_length: ``data.seq_length`` (used when ``model.max_position_embeddings`` is unset).

    Raises:
        ConfigError: an invalid value, named ``model.<field>``.
    """
    values = dataclasses.asdict(section)
    if values["vocab_size"] is None:
        values["vocab_size"] = vocab_size
    if values["max_position_embeddings"] is None:
        values["max_position_embeddings"] = seq_length
    try:
        return ModelConfig(**values)
    except ConfigError as exc:
        raise exc.with_prefix("model") from None


def position_length(config: Any) -> int:
    """The longest sequence the model sees: ``data.seq_length``, or for T5 the longer of
    the encoder's and the decoder's (``data.seq_length_decoder``); the default
    ``model.max_position_embeddings``."""
    if getattr(config.model, "type", "gpt") == "t5":
        return max(config.data.seq_length, config.data.seq_length_decoder)
    return config.data.seq_length
