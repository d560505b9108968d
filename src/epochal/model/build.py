"""``build_model``: one entry point that builds any model of the family from its config.

:data:`MODEL_CLASSES` maps ``ModelConfig.type`` to the class; a new model type
registers itself there (and in ``epochal.model.config.MODEL_TYPES``).
"""

from __future__ import annotations

import torch
from torch import nn

from epochal.model.bert import BertModel
from epochal.model.config import MODEL_TYPES, ConfigError, ModelConfig
from epochal.model.gpt import GPTModel
from epochal.model.t5 import T5Model

__all__ = ["MODEL_CLASSES", "build_model", "model_class", "model_from_state"]

#: ``ModelConfig.type`` -> the model class (ESM-2 is the encoder configured as ESM).
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "gpt": GPTModel,
    "bert": BertModel,
    "esm": BertModel,
    "t5": T5Model,
}
assert set(MODEL_CLASSES) == set(MODEL_TYPES)


def model_class(config: ModelConfig) -> type[nn.Module]:
    """The class that :func:`build_model` instantiates for ``config``.

    Raises:
        ConfigError: ``config.type`` is not registered (names ``type``).
    """
    try:
        return MODEL_CLASSES[config.type]
    except KeyError:
        raise ConfigError(
            "type", f"must be one of {sorted(MODEL_CLASSES)}, got {config.type!r}"
        ) from None


def build_model(config: ModelConfig, *, seed: int = 0) -> nn.Module:
    """Build the model ``config.type`` names, initialized from ``seed``.

    Args:
        config: the model config.
        seed: initialization seed (:mod:`epochal.model.init`). The modules are
            materialized on the current default device; under
            ``with torch.device("meta")`` they stay on ``meta`` (then ``to_empty``
            and ``init_weights``).

    Returns:
        A :class:`~epochal.model.GPTModel`, :class:`~epochal.model.BertModel` or
        :class:`~epochal.model.T5Model`.

    Raises:
        ConfigError: an unknown ``config.type``.
    """
    return model_class(config)(config, seed=seed)


def model_from_state(config: ModelConfig, state: dict[str, torch.Tensor]) -> nn.Module:
    """The model of ``config`` holding the tensors of ``state`` (no initialization is run).

    The modules are built on ``meta`` and take ``state``'s tensors as they are
    (``load_state_dict(..., assign=True)``: same device and dtype, no copy); tied
    weights are re-tied and the non-persistent buffers (rotary tables, ...) computed.

    Args:
        config: the model config.
        state: every parameter and persistent buffer of ``build_model(config)``.

    Raises:
        RuntimeError: ``state`` lacks a key or has an unexpected one (strict loading).
        ConfigError: an unknown ``config.type``.
    """
    with torch.device("meta"):
        model = build_model(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.init_buffers()
    return model
