"""``StepPlan``: what one step divides and scales its micro-batch losses by, fixed before any forward.

A train step's loss function returns one of Megatron's two forms
(:func:`split_loss_output`):

- ``(loss, logged)``: the micro-batch's loss, already a mean over what it holds
  (Megatron's default; BERT's masked-LM + binary-head sum, custom steps);
- ``(loss_sum, count, logged)``: a sum over the micro-batch's loss tokens and
  their number (Megatron-Core's ``calculate_per_token_loss`` form; epochal's GPT
  and SFT steps).

The plan turns either into the micro-batch's loss (:meth:`StepPlan.micro_batch_loss`):
the first as it is; the second as its local token mean ``loss_sum / count``, or,
with a global token count ``N`` (:attr:`StepPlan.token_weight` ``= M / N``, ``M``
the micro-batches of the global batch), as ``loss_sum * M / N``: the step's loss is
then the sum over every loss token of the global batch divided by ``N``
(``transformers``' ``num_items_in_batch``, SFT's token mean), whatever the split.
A summed form's micro-batch loss is logged as ``lm loss`` unless the step logs one.

Each micro-batch loss is then divided by :attr:`StepPlan.divisor` (this rank's
micro-batches, or the global number under the exact gradient synchronisation,
whose sums are not averaged afterwards) and multiplied by :attr:`StepPlan.loss_scale`
(the fp16 loss scaler's scale, 1.0 otherwise) for the backward only. The
mixture-of-experts balance losses take the same factor
(:attr:`StepPlan.aux_grad_factor`). Dropout seeds, one per micro-batch, ride along
(:attr:`StepPlan.seeds`).

The plan is built by the trainer once per step and handed to the engine, which
carries it into the pipeline schedule; nothing of it is kept on a model, a step or
in a batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from epochal._masked_mean import mean_from_sum

__all__ = ["LossOutput", "StepPlan", "split_loss_output"]


@dataclasses.dataclass(frozen=True)
class LossOutput:
    """A loss function's result: ``value`` is a mean (``count`` None) or a sum over ``count`` items."""

    value: torch.Tensor
    count: torch.Tensor | None
    logged: dict[str, Any]


def split_loss_output(result: Any) -> LossOutput:
    """Check a loss function's result (either form of the module docstring).

    Raises:
        ValueError: the result is not ``(scalar tensor, dict)`` or
            ``(scalar tensor, scalar tensor, dict)``, or a logged value is not a number.
    """
    forms = isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[-1], Mapping)
    if not forms:
        raise ValueError(
            "a train step's loss_func must return (loss, {'name': value}) or "
            f"(loss_sum, count, {{'name': value}}) as in Megatron, got {type(result).__name__}"
        )
    loss, logged = result[0], result[-1]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ValueError(f"a train step's loss must be a one-element tensor, got {loss!r}")
    count = result[1] if len(result) == 3 else None
    if count is not None and (not isinstance(count, torch.Tensor) or count.numel() != 1):
        raise ValueError(f"a train step's loss count must be a one-element tensor, got {count!r}")
    for name, value in logged.items():
        if not isinstance(name, str):
            raise ValueError(f"a train step's logged names must be strings, got {name!r}")
        if isinstance(value, torch.Tensor) and value.numel() != 1:
            raise ValueError(
                f"logged value {name!r} must have one element, got {tuple(value.shape)}"
            )
    return LossOutput(loss.reshape(()), None if count is None else count.reshape(()), dict(logged))


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One step's loss normalisation, loss scale and dropout seeds (module docstring).

    Attributes:
        num_microbatches: this rank's micro-batches in the step.
        divisor: what each micro-batch loss is divided by (a count of micro-batches).
        loss_scale: the fp16 loss scaler's scale multiplying the backward's loss (1.0
            without fp16); the returned and logged losses are not scaled.
        token_weight: ``M / N`` for a global token mean (summed losses only), else None.
        seeds: each of this rank's micro-batches' dropout seed, or None (the running
            random stream).
        training: a training step (False: an evaluation; no backward).
    """

    num_microbatches: int
    divisor: int
    loss_scale: float = 1.0
    token_weight: float | None = None
    seeds: tuple[int, ...] | None = None
    training: bool = True

    def __post_init__(self) -> None:
        if self.num_microbatches < 1:
            raise ValueError("a step needs at least one micro-batch")
        if self.seeds is not None and len(self.seeds) != self.num_microbatches:
            raise ValueError(
                f"{len(self.seeds)} dropout seeds for {self.num_microbatches} micro-batches"
            )

    @classmethod
    def training_step(
        cls,
        num_microbatches: int,
        *,
        divisor: int,
        loss_scale: float = 1.0,
        global_micro_batches: int | None = None,
        loss_tokens: float | None = None,
        seeds: Sequence[int] | None = None,
    ) -> StepPlan:
        """The plan of a training step.

        Args:
            num_microbatches: this rank's micro-batches.
            divisor: each micro-batch loss's divisor (the gradient synchronisation's:
                ``ParallelEngine.loss_divisor``).
            loss_scale: the fp16 scaler's scale (1.0 without).
            global_micro_batches: ``M``, the micro-batches of the whole global batch
                (with ``loss_tokens``).
            loss_tokens: ``N``, the global batch's loss tokens: summed losses become a
                global token mean; None keeps each micro-batch's own mean.
            seeds: the micro-batches' dropout seeds, or None.
        """
        weight = None
        if loss_tokens is not None:
            m = num_microbatches if global_micro_batches is None else global_micro_batches
            weight = m / max(loss_tokens, 1)
        return cls(
            num_microbatches,
            divisor,
            loss_scale,
            weight,
            None if seeds is None else tuple(int(s) for s in seeds),
        )

    @classmethod
    def evaluation(
        cls,
        num_microbatches: int,
        *,
        global_micro_batches: int | None = None,
        loss_tokens: float | None = None,
    ) -> StepPlan:
        """The plan of an evaluation batch: each micro-batch loss divided by this rank's count.

        Args:
            num_microbatches: this rank's micro-batches.
            global_micro_batches / loss_tokens: as for :meth:`training_step` (a global
                token mean, ``num_items_in_batch``); None: each micro-batch's own mean.
        """
        train = cls.training_step(
            num_microbatches,
            divisor=num_microbatches,
            global_micro_batches=global_micro_batches,
            loss_tokens=loss_tokens,
        )
        return dataclasses.replace(train, training=False)

    @property
    def aux_grad_factor(self) -> float:
        """The gradient of each MoE balance loss: the main loss's factor, ``loss_scale / divisor``."""
        return self.loss_scale / self.divisor

    @property
    def backward_scale(self) -> float:
        """What a divided micro-batch loss is multiplied by for the backward (training only)."""
        return self.loss_scale if self.training else 1.0

    def micro_batch_loss(self, out: LossOutput) -> torch.Tensor:
        """The micro-batch's loss from its loss function's result (module docstring).

        Raises:
            ValueError: a global token mean is planned and the loss is not a sum.
        """
        if out.count is None:
            if self.token_weight is not None:
                raise ValueError(
                    "a global token mean (num_items_in_batch, fine-tuning rows) needs a loss_func "
                    "that returns (loss_sum, count, logged); this one returned a mean"
                )
            return out.value
        if self.token_weight is not None:
            loss = out.value * self.token_weight
        else:
            loss = mean_from_sum(out.value, out.count)
        out.logged.setdefault("lm loss", loss.detach())
        return loss

    def divided(self, loss: torch.Tensor) -> torch.Tensor:
        """A micro-batch loss's share of the step loss: ``loss / divisor``."""
        return loss / self.divisor
