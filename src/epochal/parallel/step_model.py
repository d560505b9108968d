"""``StepModel``: the model as a train step's ``forward_step`` sees it (Megatron's model contract).

A train step (``epochal.train.GPTTrainStep`` and friends) calls
``model(tokens, ..., labels=labels)``: with ``labels`` the call returns the
per-token cross-entropy ``[b, s]`` (float32; vocabulary-parallel under tensor
parallelism, so the full logits are never gathered), without ``labels`` it returns
the model's output (logits ``[b, s, V]``, or a tuple with a second head's output).

Under pipeline parallelism the last stage's output is already computed by the
schedule when the step runs: the engine then hands the step a ``StepModel`` that
*replays* that output (its inputs are ignored; the first stage consumed the
micro-batch's ``tokens``).

Errors: a model output that is neither a tensor nor a tuple whose first item is
one raises :class:`TypeError` when labels are given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from epochal.parallel.loss import vocab_parallel_cross_entropy, vocab_parallel_prediction_hits

__all__ = ["StepModel"]


class StepModel:
    """A callable model wrapper with Megatron's ``labels=`` contract.

    Args:
        forward: ``forward(*args, **kwargs) -> output`` (the model part, or a replay).
        loss_group: the tensor-parallel group when the logits are sharded over the
            vocabulary (vocabulary-parallel cross-entropy), else None.
        module: the underlying module (for ``.training``, ``.config``); None for a replay.
        training: the mode to report when ``module`` is None.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        *,
        loss_group: dist.ProcessGroup | None = None,
        module: torch.nn.Module | None = None,
        training: bool = True,
    ) -> None:
        self._forward = forward
        self.loss_group = loss_group
        self.module = module
        self._training = training

    @classmethod
    def replay(
        cls, output: Any, *, loss_group: dist.ProcessGroup | None, training: bool
    ) -> StepModel:
        """A model whose every call returns ``output`` (the pipeline's last-stage output)."""
        return cls(lambda *args, **kwargs: output, loss_group=loss_group, training=training)

    @property
    def training(self) -> bool:
        """Whether the model is in training mode (evaluation runs without gradients)."""
        return self.module.training if self.module is not None else self._training

    def per_token_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy per token, float32 shaped like ``labels`` (vocabulary-parallel if sharded)."""
        return vocab_parallel_cross_entropy(logits, labels, self.loss_group)

    def prediction_hits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """bool ``[b, s]``: the top logit is the label's (vocabulary-parallel if sharded)."""
        return vocab_parallel_prediction_hits(logits, labels, self.loss_group)

    def __call__(self, *args: Any, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """Run the model; with ``labels``, per-token losses instead of logits.

        Arguments go to the model unchanged (``None`` means the model's default,
        e.g. ``position_ids=None``).

        Returns:
            the output, or float32 ``[b, s]`` losses when ``labels`` is given; with
            a tuple output (e.g. BERT's binary head), ``(losses, *rest)``.
        """
        output = self._forward(*args, **kwargs)
        if labels is None:
            return output
        if isinstance(output, tuple):
            if not output or not isinstance(output[0], torch.Tensor):
                raise TypeError("the model returned a tuple without logits first")
            return (self.per_token_loss(output[0], labels), *output[1:])
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"the model returned {type(output).__name__}, not logits")
        return self.per_token_loss(output, labels)
