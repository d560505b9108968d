"""How a step's gradients and losses are synchronised: chosen once, when the engine is built.

:func:`gradient_sync` picks one of two strategies for a
:class:`~epochal.parallel.engine.ParallelEngine`; the step calls the same methods
whichever it is (torchtitan's ``parallelize`` keeps this choice out of its step too):

- :meth:`~PlainGradSync.loss_divisor`: each micro-batch loss's divisor;
- :meth:`~PlainGradSync.before_forward` / :meth:`~PlainGradSync.before_backward` /
  :meth:`~PlainGradSync.after_backward`: around each micro-batch;
- :meth:`~PlainGradSync.finish`: after the last backward (gradients final);
- :meth:`~PlainGradSync.step_loss` / :meth:`~PlainGradSync.eval_loss`: the step's loss
  from this rank's micro-batch losses, the same on every rank;
- :meth:`~PlainGradSync.clip_norm`: the global gradient norm, clipped;
- :meth:`~PlainGradSync.reduce_logged`: the logged values of a step.

:class:`PlainGradSync` (Megatron's): each micro-batch loss divided by this rank's
micro-batches; the data-parallel wrapper reduces (and averages) bucketed gradients
overlapped with the last micro-batch's backward (:mod:`epochal.parallel.data_parallel`),
partial tensor-parallel gradients are summed once (:func:`finalize_grads`), tied
pipeline copies summed over the embedding group; the loss is averaged over the
data-parallel ranks.

:class:`ExactGradSync` (the trainer's ``training.layout_invariant``): the same bits under every
data-parallel size, accumulation, sharding and pipeline split: each micro-batch loss
divided by the global number of micro-batches, gradients accumulated in the global
micro-batch order (:class:`~epochal.parallel.ordered_reduce.OrderedGradReducer`, armed
before each backward), losses and logged values summed in that order
(:mod:`epochal.parallel.global_order`), the norm exact
(:mod:`epochal.parallel.exact_norm`).

Expert and context parallelism plug in: the experts' gradients are reduced over
their expert-data-parallel group first (:meth:`ExpertParallel.finish_grads`, ordered
under the exact strategy) and counted once in the norm; the context-parallel chunks'
gradients are summed after (:meth:`ContextParallel.reduce_grads`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.parallel.canonical_step_sum import finish_step_sums
from epochal.parallel.data_parallel import set_gradient_sync
from epochal.parallel.exact_norm import clip_grad_norm_exact
from epochal.parallel.global_order import gather_in_order, sequential_sum
from epochal.parallel.grad_clip import clip_grad_norm_parallel
from epochal.parallel.logged import reduce_logged
from epochal.parallel.ordered_reduce import OrderedGradReducer, finalize_partial_grads

__all__ = ["ExactGradSync", "PlainGradSync", "finalize_grads", "gradient_sync"]


@torch.no_grad()
def finalize_grads(parts: Sequence[nn.Module]) -> None:
    """Turn ``Partial`` DTensor gradients into the parameters' placements (one reduction each).

    Replicated tensor-parallel parameters whose use is split over the ranks
    (sequence-parallel norms, replicated key/value projections, positions)
    accumulate partial gradients; without a data-parallel wrapper (which does
    this itself) they are summed here once per step, as Megatron's
    ``finalize_model_grads`` does.
    """
    for part in parts:
        for p in part.parameters():
            g = p.grad
            if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
                p.grad = g.redistribute(placements=p.placements)


class PlainGradSync:
    """Megatron's gradient synchronisation (module docstring).

    Args:
        engine: the :class:`~epochal.parallel.engine.ParallelEngine` (its parts,
            groups and layout are read; nothing is written on it).
    """

    #: losses, logged values and gradients summed in the global micro-batch order
    exact = False

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def loss_divisor(self, num_microbatches: int) -> int:
        """This rank's micro-batches (the data-parallel average divides by the rest)."""
        return num_microbatches

    def before_forward(self, index: int, num_microbatches: int) -> None:
        """Let the data-parallel wrapper reduce during the last micro-batch's backward only."""
        set_gradient_sync(self.engine.model_parts, index == num_microbatches - 1)

    def before_backward(self) -> None:
        """Nothing to arm (the wrapper's hooks reduce)."""

    def after_backward(self, stage_index: int) -> None:
        """Nothing to do after a stage's backward of a micro-batch."""

    def finish(self) -> None:
        """Experts, partial tensor-parallel gradients, context chunks, tied copies: final gradients."""
        e = self.engine
        if e.ep is not None:
            e.ep.finish_grads()
        if e.dims.dp == 1:
            finalize_grads(e.model_parts)
        if e.cp is not None:  # after the data-parallel averaging: a sum over the chunks
            e.cp.reduce_grads(e.parameters())
        if e.tied:
            tied = []
            if e.has_first_stage:
                tied.append(e.stage_part(0).tok_embeddings.weight)
            if e.has_last_stage:
                tied.append(e.stage_part(e.dims.num_stages - 1).output.weight)
            e.embedding_group.all_reduce_grads(tied)

    def step_loss(self, divided: Sequence[torch.Tensor]) -> torch.Tensor:
        """The step loss: this rank's divided micro-batch losses added, averaged over data-parallel ranks."""
        total = torch.zeros((), device=self.engine.device)
        for loss in divided:
            total += loss
        return self._average_over_dp(total)

    def eval_loss(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        """An evaluation batch's loss: the mean of this rank's micro-batch losses, averaged over ranks."""
        total = torch.zeros((), device=self.engine.device)
        for loss in losses:
            total += loss / len(losses)
        return self._average_over_dp(total)

    def pipeline_loss(
        self, losses: Sequence[torch.Tensor], divided: Sequence[torch.Tensor], training: bool
    ) -> torch.Tensor:
        """The step loss (training) or evaluation loss from the last pipeline stage, on every rank.

        Args:
            losses / divided: the last stage's micro-batch losses and the same divided by
                the plan, in micro-batch order (empty on the other stages).
            training: a training step (else an evaluation).
        """
        e = self.engine
        total = torch.zeros((), device=e.device)
        if divided:
            total = torch.stack(list(divided)).sum().to(e.device)
        dist.broadcast(total, group=e.pp_group, group_src=e.dims.pp - 1)
        return self._average_over_dp(total)

    def _average_over_dp(self, total: torch.Tensor) -> torch.Tensor:
        e = self.engine
        group = e.dp_group
        if group is not None:
            dist.all_reduce(total, group=group)
            total = total / e.dims.dp
        return total

    def reduce_logged(self, logged: list[dict[str, Any]]) -> dict[str, float]:
        """The step's logged values, averaged over micro-batches and data-parallel ranks."""
        e = self.engine
        return reduce_logged(
            logged,
            pp_group=e.pp_group,
            pp_src=e.dims.pp - 1,
            dp_group=e.dp_group,
            device=e.device,
            ordered=self.exact,
        )

    def evaluation_record(self) -> EvaluationRecord:
        """An evaluation's losses and logged values, batch by batch (:class:`EvaluationRecord`)."""
        return EvaluationRecord(self.engine, ordered=self.exact)

    def clip_norm(self, max_norm: float) -> torch.Tensor:
        """Clip to the global L2 norm ``max_norm`` (0 = measure only); return the norm."""
        e = self.engine
        exclude = list(e.duplicated_parameters())
        sharded = None
        if e.ep is not None:
            exclude += e.ep.norm_replicas()
            sharded = (e.ep.parameters(), e.ep.norm_group())
        return clip_grad_norm_parallel(
            e.parameters(),
            max_norm,
            pp_group=e.pp_group,
            exclude_from_norm=exclude,
            sharded=sharded,
        )


class ExactGradSync(PlainGradSync):
    """The layout-invariant synchronisation (module docstring): ordered sums, exact norm."""

    exact = True

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.reducer = self._build_reducer()

    def _build_reducer(self) -> OrderedGradReducer | None:
        """The ordered gradient reduction (data parallelism, tied pipeline copies), or None."""
        e = self.engine
        tied = None
        if e.tied and e.has_first_stage:
            tied = ("first", e.stage_part(0).tok_embeddings.weight)
        elif e.tied and e.has_last_stage:
            tied = ("last", e.stage_part(e.dims.num_stages - 1).output.weight)
        reducer = OrderedGradReducer(
            e.model_parts,
            e.dp_group,
            replicate=e.config.dp_sharding == "none",
            tied=tied,
            tied_group=e.embedding_group.group,
        )
        return reducer if reducer.active else None

    def loss_divisor(self, num_microbatches: int) -> int:
        """The global number of micro-batches (the same value on every rank)."""
        return num_microbatches * self.engine.dims.dp

    def before_forward(self, index: int, num_microbatches: int) -> None:
        """The wrapper never reduces while the ordered reducer runs (else: on the last)."""
        last = index == num_microbatches - 1
        set_gradient_sync(self.engine.model_parts, last and self.reducer is None)

    def before_backward(self) -> None:
        """Arm the reducer: each unit's gradients are sent once complete."""
        if self.reducer is not None:
            self.reducer.arm()

    def after_backward(self, stage_index: int) -> None:
        """Take the stage's gradients of the micro-batch just run into the ordered sums."""
        if self.reducer is not None:
            self.reducer.after_backward(stage_index)

    def finish(self) -> None:
        """Experts, the ordered sums, partial tensor-parallel gradients, then the context chunks."""
        e = self.engine
        if e.ep is not None:
            e.ep.finish_grads()
        if self.reducer is not None:
            self.reducer.finish()
        if e.dims.dp == 1:
            finalize_partial_grads(e.model_parts)
        finish_step_sums(e.model_parts)  # canonical units' weight trees, once per step
        if e.cp is not None and not e.canonical_degree:  # the ordered per-rank sums, then
            e.cp.reduce_grads(
                e.parameters()
            )  # summed over the chunks (canonical: done in the backward)

    def _ordered(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        ordered = gather_in_order(torch.stack(list(losses)), self.engine.dp_group)
        self.engine.micro_batch_losses = ordered.tolist()
        return ordered

    def step_loss(self, divided: Sequence[torch.Tensor]) -> torch.Tensor:
        """Every rank's divided micro-batch losses added in the global order."""
        return sequential_sum(self._ordered(divided))

    def eval_loss(self, losses: Sequence[torch.Tensor]) -> torch.Tensor:
        """The micro-batch losses of every rank added in the global order, then averaged."""
        ordered = self._ordered(losses)
        return sequential_sum(ordered) / len(ordered)

    def pipeline_loss(
        self, losses: Sequence[torch.Tensor], divided: Sequence[torch.Tensor], training: bool
    ) -> torch.Tensor:
        """The last stage's per-micro-batch losses in global order, on every stage.

        Sets the engine's ``micro_batch_losses`` (training: the divided losses;
        evaluation: the losses); returns the step loss (their sequential sum) or the
        evaluation's (their mean).
        """
        e = self.engine
        values: list[float] = []
        if e.has_last_stage:
            mine = torch.stack(list(divided if training else losses)).to(e.device)
            values = gather_in_order(mine, e.dp_group).tolist()
        box: list[Any] = [values]
        dist.broadcast_object_list(box, group=e.pp_group, group_src=e.dims.pp - 1)
        e.micro_batch_losses = box[0]
        ordered = torch.tensor(e.micro_batch_losses, dtype=torch.float32, device=e.device)
        total = sequential_sum(ordered) if training else sequential_sum(ordered) / len(ordered)
        dist.broadcast(total, group=e.pp_group, group_src=e.dims.pp - 1)
        return total

    def clip_norm(self, max_norm: float) -> torch.Tensor:
        """The exact global norm (each expert counted by its owners' first replica)."""
        e = self.engine
        param_coords = None
        if e.ep is not None:
            own = {"dp": e.ep.edp_rank, "cp": e.cp_rank, "tp": e.tp_rank}
            param_coords = {id(p): own for p in e.ep.parameters()}
        return clip_grad_norm_exact(
            e.parameters(),
            max_norm,
            group=dist.group.WORLD if e.mesh is not None else None,
            exclude=e.duplicated_parameters(),
            coords={"dp": e.dp_rank, "cp": e.cp_rank, "tp": e.tp_rank},
            param_coords=param_coords,
            pieces=e.canonical_degree or 1,
        )


class EvaluationRecord:
    """The loss and logged values of an evaluation's global batches, added as they run.

    Plain: the mean of the batches' losses, the logged values reduced per batch.
    Ordered (the exact synchronisation): every micro-batch's loss added in the global
    order and averaged per micro-batch, the logged values of every micro-batch in that
    order, as one process computes them (``Trainer.validation_pass``).

    Args:
        engine: the engine whose :meth:`~epochal.parallel.engine.ParallelEngine.eval_loss`
            ran the batches.
        ordered: the exact synchronisation's form.
    """

    def __init__(self, engine: Any, *, ordered: bool) -> None:
        self.engine = engine
        self.ordered = ordered
        self.logged: list[dict[str, float]] = []
        self._batch_losses: list[float] = []
        self._micro_batch_losses: list[float] = []

    def add(self, loss: torch.Tensor) -> None:
        """Record the batch the engine just evaluated (a collective: every rank calls it)."""
        if self.ordered:
            self.logged += self.engine.ordered_logged()
            self._micro_batch_losses += self.engine.micro_batch_losses
        else:
            self.logged.append(self.engine.reduce_logged())
        self._batch_losses.append(float(loss.item()))

    def mean(self) -> float:
        """The evaluation's loss."""
        values = self._micro_batch_losses if self.ordered else self._batch_losses
        mean = 0.0
        for value in values:
            mean += value
        return mean / len(values)


def gradient_sync(engine: Any, *, exact: bool) -> PlainGradSync:
    """The strategy of ``engine``: :class:`ExactGradSync` if ``exact``, else :class:`PlainGradSync`."""
    return ExactGradSync(engine) if exact else PlainGradSync(engine)
