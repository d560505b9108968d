"""``TrainStep``: what the trainer does with one micro-batch (Megatron's / Accelerate's contract).

The trainer calls, for every micro-batch (training and evaluation, every layout,
the pipeline's last stage included)::

    output_tensor, loss_func = step.forward_step(data_iterator, model)
    loss, logged = loss_func(output_tensor)

- ``data_iterator`` yields the micro-batch: a dict of tensors on the device
  (``tokens``, ``labels``, ``loss_mask`` and whatever the data adds);
  :meth:`TrainStep.get_batch` turns it into the model's inputs.
- ``model`` is a :class:`~epochal.parallel.step_model.StepModel`: called with
  ``labels=...`` it returns float32 per-token losses ``[b, s]`` (vocabulary-parallel
  under tensor parallelism), without it the logits. Under pipeline parallelism
  the call returns what the last stage computed (the first stage has consumed the
  micro-batch's ``tokens``).
- ``loss`` is the micro-batch's scalar loss; the trainer divides it by the number
  of micro-batches and back-propagates it (Megatron's default).
- ``logged`` maps names to numbers; per step they are averaged over micro-batches
  and data-parallel ranks and written under those names to ``metrics.jsonl``.

Subclass and override either the methods (``get_batch``, ``forward_step``,
``loss_func``) or, as in Accelerate's Megatron-LM guide, the factories
``get_batch_func()``, ``get_forward_step_func()`` and ``get_loss_func()`` that
return them; ``__init__(args, **kwargs)`` receives the training configuration.

A registry (:mod:`epochal.train.steps.registry`) maps model types (``model.type``) to
their step class.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import torch

from epochal.model.config import ConfigError

__all__ = [
    "TrainStep",
    "load_eval_callback",
    "load_train_step",
]


class TrainStep:
    """Base class of train steps (see the module docstring).

    Args:
        args: the training configuration (:class:`~epochal.train.config.TrainConfig`)
            or None; kept as ``self.args``.
        **kwargs: kept as ``self.kwargs`` (``[training.train_step_kwargs]``).
    """

    _PARTS = (
        ("get_batch", "get_batch_func"),
        ("loss_func", "get_loss_func"),
        ("forward_step", "get_forward_step_func"),
    )

    def __init__(self, args: Any = None, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        cls = type(self)
        for method, factory in self._PARTS:
            # Accelerate's style: a factory overridden by a subclass provides the callable.
            if getattr(cls, factory) is not getattr(TrainStep, factory):
                setattr(self, method, getattr(self, factory)())
            elif not callable(getattr(cls, method, None)):
                raise TypeError(
                    f"train step {cls.__qualname__} defines neither {method} nor {factory}"
                )

    # ------------------------------------------------------------ factories
    def get_batch_func(self) -> Callable[..., Any]:
        """The ``get_batch(data_iterator)`` callable (default: the method)."""
        return self.get_batch  # type: ignore[attr-defined]

    def get_loss_func(self) -> Callable[..., Any]:
        """The ``loss_func(..., output_tensor) -> (loss, {name: value})`` callable (default: the method)."""
        return self.loss_func  # type: ignore[attr-defined]

    def get_forward_step_func(self) -> Callable[..., Any]:
        """The ``forward_step(data_iterator, model) -> (output_tensor, loss_func)`` callable."""
        return self.forward_step  # type: ignore[attr-defined]

    def eval_summary(self, logged: dict[str, float]) -> dict[str, float]:
        """Derived values of an evaluation from its averaged logged values (default: unchanged)."""
        return dict(logged)

    def evaluation_loss(self, mean_loss: float, summary: dict[str, float]) -> float:
        """The loss an evaluation reports, from the mean of its micro-batch losses and
        its :meth:`eval_summary` (default: that mean, Megatron's)."""
        return mean_loss

    def perplexity(self, loss: float, summary: dict[str, float]) -> float | None:
        """The evaluation's perplexity: ``exp(loss)`` of a token cross-entropy (default);
        None where it means nothing (a step overrides it)."""
        return math.exp(loss) if loss < 700 else math.inf

    #: Keys of a micro-batch that hold one entry per sample whatever their shape, for
    #: ``data.pack_sequences`` (:func:`epochal.data.loading.packing.pack_padded_batch`).
    per_sample_keys: tuple[str, ...] = ()

    #: Megatron-Core's ``calculate_per_token_loss``: the loss function returns ``(loss_sum,
    #: count, logged)`` and the step's loss is the global batch's token mean where the
    #: trainer knows the global count (the data's loss-token counts, ``num_items_in_batch``;
    #: else each micro-batch's token mean), weighed by the step plan
    #: (:mod:`epochal.parallel.step_plan`). False: each micro-batch's own mean (Megatron's default).
    calculate_per_token_loss: bool = False

    #: Under pipeline parallelism every stage (not only the first and last) reads
    #: the micro-batches, for :meth:`stage_kwargs` (e.g. BERT's padding mask).
    every_stage_reads_batches: bool = False

    def input_ids(self, micro_batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The token ids ``[b, s]`` the first pipeline stage embeds (default ``tokens``).

        Only used under pipeline parallelism, where the schedule feeds the first stage.
        """
        return micro_batch["tokens"]

    def stage_kwargs(self, micro_batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Keyword inputs of every pipeline stage's forward besides the tokens / hidden states.

        Only used under pipeline parallelism, where the schedule (not
        :meth:`forward_step`) runs the stages; ``[b, ...]`` tensors of one micro-batch.
        """
        return {}


def _import_spec(spec: str, option: str, what: str) -> Any:
    """The object named by ``"package.module:attr"`` (``attr`` may be dotted).

    Raises:
        ConfigError: (naming ``option``) a malformed spec, or a module or attribute
            that cannot be imported.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(option, f"must look like 'package.module:{what}', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(option, f"cannot import module {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(option, f"module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_train_step(spec: str) -> type[TrainStep]:
    """Import the train step class ``package.module:Class`` (``training.train_step``).

    Raises:
        ConfigError: (naming ``training.train_step``) a malformed spec, a module or
            attribute that cannot be imported, or not a :class:`TrainStep` subclass.
    """
    obj = _import_spec(spec, "training.train_step", "Class")
    if not (isinstance(obj, type) and issubclass(obj, TrainStep)):
        raise ConfigError(
            "training.train_step",
            f"{spec!r} is not a train step class (subclass GPTTrainStep or BertTrainStep)",
        )
    return obj


def load_eval_callback(spec: str) -> Callable[..., Any]:
    """Import the evaluation callback ``package.module:function`` (``training.eval_callback``).

    The callback is called as ``fn(batch, logits) -> {name: number} | None`` for
    every validation micro-batch (see ``Trainer.add_eval_callback``).

    Raises:
        ConfigError: (naming ``training.eval_callback``) a malformed spec, a module
            or attribute that cannot be imported, or an object that is not callable
            (a class is refused: pass a function).
    """
    obj = _import_spec(spec, "training.eval_callback", "function")
    if isinstance(obj, type) or not callable(obj):
        raise ConfigError(
            "training.eval_callback",
            f"{spec!r} is not a function fn(batch, logits) -> dict | None",
        )
    return obj
