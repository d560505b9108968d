"""The registry of train steps: ``model.type`` -> the step class that trains it.

Each model type's step registers itself with :func:`register_train_step` when its
module is imported (:mod:`epochal.train.steps` imports the built-in ones: GPT, BERT /
ESM-2, T5, the fine-tuning heads); :func:`train_step_class` looks one up. A user's step registers the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from epochal.model.config import ConfigError
from epochal.train.steps.base import TrainStep

__all__ = ["register_train_step", "train_step_class"]

_REGISTRY: dict[str, type[TrainStep]] = {}


def register_train_step(*model_types: str) -> Callable[[type[TrainStep]], type[TrainStep]]:
    """Class decorator: the default step of ``model_types`` (``model.type`` values)."""

    def register(cls: type[TrainStep]) -> type[TrainStep]:
        for name in model_types:
            _REGISTRY[name] = cls
        return cls

    return register


def train_step_class(model_type: str, head: str = "mlm") -> type[TrainStep]:
    """The registered step class of ``model_type``, or of a fine-tuning ``head`` (``model.head``:
    one step per head kind, whatever the encoder).

    Raises:
        ConfigError: (naming ``model.type``) no step is registered for it.
    """
    # Importing the package registers the built-in steps (it imports them); the
    # registry itself names none of them.
    importlib.import_module("epochal.train.steps")
    if head != "mlm":
        model_type = head
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise ConfigError(
            "model.type", f"has no train step: {model_type!r} (known: {sorted(_REGISTRY)})"
        ) from None
