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

Evaluation metrics: a ``StepModel`` built with ``on_logits`` hands every call's
logits (the first item of a tuple output), detached and gathered over the vocabulary
when sharded (``[b, s, V]``, the padded vocabulary), to that function: the trainer's
way to return logits from the last pipeline stage (Accelerate's ``return_logits``).

Context parallelism: a ``StepModel`` built with ``context_parallel`` (a
:class:`~epochal.parallel.context_parallel.ContextParallel`) takes the whole
micro-batch's ``[b, S]`` inputs, runs this rank's chunks and returns per-token
losses gathered back to ``[b, S]`` in global order (without labels: the gathered
output; of a tuple, its first item; a fine-tuning head's output, whole already,
as it is), so a train step's token mean is the global one; ``on_logits`` receives the
logits gathered to the whole sequence.

Errors: a model output that is neither a tensor nor a tuple whose first item is
one raises :class:`TypeError` when labels are given.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from epochal.model.layers.moe import pop_moe_stats
from epochal.parallel.canonical import Reductions
from epochal.parallel.canonical_ops import canonical_cross_entropy
from epochal.parallel.loss import (
    gather_vocab_shards,
    vocab_parallel_cross_entropy,
    vocab_parallel_prediction_hits,
)
from epochal.parallel.step_plan import StepPlan, split_loss_output

__all__ = ["LogitsObserver", "StepModel", "merge_observers", "observe_logits", "run_train_step"]

#: ``observer(micro_batch, logits) -> {name: number} | None``: an evaluation callback.
LogitsObserver = Callable[[dict[str, torch.Tensor], torch.Tensor], "Mapping[str, Any] | None"]


class StepModel:
    """A callable model wrapper with Megatron's ``labels=`` contract.

    Args:
        forward: ``forward(*args, **kwargs) -> output`` (the model part, or a replay).
        loss_group: the tensor-parallel group when the logits are sharded over the
            vocabulary (vocabulary-parallel cross-entropy), else None.
        module: the underlying module (for ``.training``, ``.config``); None for a replay.
        training: the mode to report when ``module`` is None.
        on_logits: called with each call's whole logits ``[b, s, V]`` (detached;
            a collective over ``loss_group`` when the logits are sharded).
        cross_entropy: ``(logits, labels, vocab) -> float32 losses`` for unsharded logits
            (:func:`epochal.parallel.token_loss.token_cross_entropy`); None = the plain
            upcast cross-entropy. Sharded logits always use the vocabulary-parallel one.
        vocab_size: the logit columns the loss's softmax and the top-1 hits cover
            (:attr:`epochal.model.ModelConfig.softmax_vocab_size`); None = the
            ``module``'s ``config.softmax_vocab_size``, else every column.
        context_parallel: a ``ContextParallel``: cut the inputs, gather the outputs
            (module docstring).
        canonical_degree: the invariance degree the model computes in (0: none):
            the cross-entropy is then :func:`~epochal.parallel.canonical_ops.canonical_cross_entropy`
            (its vocabulary sum in that many chunks), sharded or not.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        *,
        loss_group: dist.ProcessGroup | None = None,
        module: torch.nn.Module | None = None,
        training: bool = True,
        on_logits: Callable[[torch.Tensor], None] | None = None,
        cross_entropy: Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
        | None = None,
        context_parallel: Any = None,
        vocab_size: int | None = None,
        canonical_degree: int = 0,
    ) -> None:
        self.context_parallel = context_parallel
        self.canonical: Reductions | None = None
        if canonical_degree:
            sharded = loss_group is not None and dist.get_world_size(loss_group) > 1
            self.canonical = Reductions(canonical_degree, loss_group if sharded else None)
        if vocab_size is None and module is not None:
            vocab_size = getattr(getattr(module, "config", None), "softmax_vocab_size", None)
        self.vocab_size = vocab_size
        if context_parallel is not None and module is not None:
            forward = context_parallel.forward(module)
        self._forward = forward
        self.cross_entropy = cross_entropy
        self.loss_group = loss_group
        self.module = module
        self._training = training
        self.on_logits = on_logits

    @classmethod
    def replay(
        cls,
        output: Any,
        *,
        loss_group: dist.ProcessGroup | None,
        training: bool,
        on_logits: Callable[[torch.Tensor], None] | None = None,
        context_parallel: Any = None,
        vocab_size: int | None = None,
        canonical_degree: int = 0,
    ) -> StepModel:
        """A model whose every call returns ``output`` (the pipeline's last-stage output).

        With ``context_parallel``, ``output`` holds this rank's chunks: labels are cut
        and losses (or the output) gathered as for a module.
        """
        return cls(
            lambda *args, **kwargs: output,
            loss_group=loss_group,
            training=training,
            on_logits=on_logits,
            context_parallel=context_parallel,
            vocab_size=vocab_size,
            canonical_degree=canonical_degree,
        )

    @property
    def training(self) -> bool:
        """Whether the model is in training mode (evaluation runs without gradients)."""
        return self.module.training if self.module is not None else self._training

    def per_token_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy per token, float32 shaped like ``labels`` (vocabulary-parallel if sharded)."""
        if self.canonical is not None:
            return canonical_cross_entropy(logits, labels, self.canonical, self.vocab_size)
        sharded = self.loss_group is not None and dist.get_world_size(self.loss_group) > 1
        if self.cross_entropy is not None and not sharded:
            return self.cross_entropy(logits, labels, self.vocab_size)
        return vocab_parallel_cross_entropy(logits, labels, self.loss_group, self.vocab_size)

    def prediction_hits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """bool ``[b, s]``: the top logit is the label's (vocabulary-parallel if sharded)."""
        return vocab_parallel_prediction_hits(logits, labels, self.loss_group, self.vocab_size)

    def __call__(self, *args: Any, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        """Run the model; with ``labels``, per-token losses instead of logits.

        Arguments go to the model unchanged (``None`` means the model's default,
        e.g. ``position_ids=None``).

        Returns:
            the output, or float32 ``[b, s]`` losses when ``labels`` is given; with
            a tuple output (e.g. BERT's binary head), ``(losses, *rest)``.
        """
        output = self._forward(*args, **kwargs)
        cp = self.context_parallel
        if cp is not None:
            if labels is not None:
                first = output[0] if isinstance(output, tuple) else output
                if self.on_logits is not None:  # evaluation metrics: the whole sequence's logits
                    whole = cp.gather(first.detach())
                    self.on_logits(gather_vocab_shards(whole, self.loss_group))
                losses = cp.gather(self.per_token_loss(first, cp.shard(labels)))
                return (losses, *output[1:]) if isinstance(output, tuple) else losses
            if getattr(self.module, "head", None) is not None:
                pass  # a fine-tuning head read the gathered sequence: its output is whole
            elif isinstance(output, tuple):  # e.g. (logits, binary logits): the rest is whole
                output = (cp.gather(output[0]), *output[1:])
            else:
                output = cp.gather(output)
        if self.on_logits is not None:
            first = output[0] if isinstance(output, tuple) and output else output
            if isinstance(first, torch.Tensor):
                self.on_logits(gather_vocab_shards(first.detach(), self.loss_group))
        if labels is None:
            return output
        if isinstance(output, tuple):
            if not output or not isinstance(output[0], torch.Tensor):
                raise TypeError("the model returned a tuple without logits first")
            return (self.per_token_loss(output[0], labels), *output[1:])
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"the model returned {type(output).__name__}, not logits")
        return self.per_token_loss(output, labels)


def run_train_step(
    step: Any,
    micro_batch: dict[str, torch.Tensor],
    model: StepModel,
    plan: StepPlan,
    on_logits: LogitsObserver | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One micro-batch through a train step: ``(loss, logged)``, the loss as ``plan`` makes it.

    ``output, loss_func = step.forward_step(iter([micro_batch]), model)``, then
    ``loss_func(output)`` checked by :func:`~epochal.parallel.step_plan.split_loss_output`
    and turned into the micro-batch's loss by :meth:`StepPlan.micro_batch_loss`
    (not yet divided by the plan's divisor).
    With ``on_logits``, the step's model call hands its logits to it (see
    :func:`observe_logits`) and what it returns joins ``logged``. The records of
    the mixture-of-experts layers of ``model.module`` (none for a pipeline stage's replay,
    whose records :mod:`epochal.parallel.pipeline_step` gathers) join
    ``logged`` too (:func:`~epochal.model.layers.moe.pop_moe_stats`: the balance and
    z-losses, tokens per expert; nothing for a dense model).

    Raises:
        ValueError: the loss function returned neither Megatron form, or a mean where
            ``plan`` wants a sum.
    """
    captured: list[torch.Tensor] = []
    if on_logits is not None:
        model = copy.copy(model)
        model.on_logits = captured.append
    output, loss_func = step.forward_step(iter([micro_batch]), model)
    out = split_loss_output(loss_func(output))
    loss, logged = plan.micro_batch_loss(out), out.logged
    if on_logits is not None:
        observe_logits(on_logits, micro_batch, captured, logged)
    if model.module is not None:
        logged.update(pop_moe_stats(model.module))
    return loss, logged


def observe_logits(
    observer: LogitsObserver,
    micro_batch: dict[str, torch.Tensor],
    captured: list[torch.Tensor],
    logged: dict[str, Any],
) -> None:
    """Call ``observer(micro_batch, logits)`` and add what it returns to ``logged``.

    ``captured`` holds the logits of the micro-batch's model calls (the last one is
    used). The returned names are then averaged like the train step's own logged
    values (over micro-batches and data-parallel ranks).

    Raises:
        ValueError: the train step never called the model (no logits).
        TypeError: the observer returned neither None nor a dict of numbers.
    """
    if not captured:
        raise ValueError(
            "the train step's forward_step did not call the model: no logits to observe"
        )
    result = observer(micro_batch, captured[-1])
    if result is None:
        return
    if not isinstance(result, Mapping):
        raise TypeError(
            f"an evaluation callback must return None or a dict of numbers, got {type(result).__name__}"
        )
    for name, value in result.items():
        if not isinstance(name, str) or not isinstance(value, (int, float, torch.Tensor)):
            raise TypeError(
                f"an evaluation callback returned {name!r}: {value!r}; "
                "it must map names (str) to numbers"
            )
        logged[name] = value


def merge_observers(fns: list[LogitsObserver]) -> LogitsObserver | None:
    """One observer calling each of ``fns`` (through :func:`observe_logits`); None for none."""
    if not fns:
        return None

    def observe(batch: dict[str, torch.Tensor], logits: torch.Tensor) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for fn in fns:
            logged: dict[str, Any] = {}
            observe_logits(fn, batch, [logits], logged)
            merged.update(logged)
        return merged

    return observe
