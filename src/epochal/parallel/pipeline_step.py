"""The engine's pipeline-parallel step: the schedules, and one call's state in a :class:`PipelineRun`.

:class:`PipelineRunner` (held by :class:`~epochal.parallel.engine.ParallelEngine`)
builds this rank's ``PipelineStage`` objects and one
``torch.distributed.pipelining`` schedule per (micro-batches, training or
evaluation), and runs one global batch of this data-parallel rank through it
(:meth:`PipelineRunner.run`). Everything a call needs or produces lives in its
:class:`PipelineRun`: the micro-batches, the step and its plan, each micro-batch's
loss, logged values and logits. The schedules' loss callback hands the last stage's
output and its target, the micro-batch's index (one per sample row), to the current
run (:meth:`PipelineRun.loss`), which runs the train step on a replay of the output
(:meth:`~epochal.parallel.step_model.StepModel.replay`) and divides its loss by the
plan. The step loss is computed by the gradient synchronisation
(:mod:`epochal.parallel.grad_sync`) from the last stage's losses, on every rank; the micro-batch
seeds of keyed dropout reach every stage as a keyword
(:mod:`epochal.parallel.dropout_keys`), and each training stage's backward of a
micro-batch is followed by the synchronisation's ``after_backward``.

Mixture-of-experts records (:class:`StageMoERecords`): each micro-batch's records
cover every MoE layer, as one process's do. A stage's layers keep their statistics
after each forward (in micro-batch order, the schedules' order of forwards on one
stage; a schedule's first step is preceded by one forward of its set-up, which is
left out); after the schedule they are gathered over the pipeline group and the last
stage turns each micro-batch's layers into its records
(:func:`~epochal.model.layers.moe.moe_records`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from epochal.model.layers.moe import moe_records, reset_expert_counts, take_moe_layer_stats
from epochal.parallel.canonical_step_sum import begin_step_sums
from epochal.parallel.dropout_keys import DROPOUT_SEED_KWARG
from epochal.parallel.pipeline import build_schedule
from epochal.parallel.step_model import LogitsObserver, StepModel, observe_logits, run_train_step
from epochal.parallel.step_plan import StepPlan

__all__ = ["PipelineRun", "PipelineRunner", "StageMoERecords"]


@functools.cache
def _stage_class() -> type:
    """``PipelineStage`` that calls ``on_backward(index)`` after each backward of a micro-batch."""
    from torch.distributed.pipelining import PipelineStage  # imports TorchDynamo

    class SyncedStage(PipelineStage):
        def __init__(self, *args: Any, on_backward: Callable[[], None], **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._on_backward = on_backward

        def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
            out = super().backward_one_chunk(*args, **kwargs)
            self._on_backward()
            return out

        def _post_metadata_inference_cleanup(self) -> None:
            # a new schedule's set-up runs a real forward and backward (the shapes of its
            # messages); the leaves that backward left in the canonical units' step sums
            # belong to no micro-batch (the parameters' .grad it leaves untouched)
            cleanup = getattr(super(), "_post_metadata_inference_cleanup", None)
            if cleanup is not None:
                cleanup()
            begin_step_sums([self.submod])
            reset_expert_counts([self.submod])  # MoE's balancing counts: none of the step's

    return SyncedStage


@dataclasses.dataclass
class PipelineRun:
    """One call of :meth:`PipelineRunner.run`: its inputs and what the last stage computes.

    Attributes:
        micro_batches: this rank's micro-batches (empty on middle stages).
        plan: the step plan (:class:`~epochal.parallel.step_plan.StepPlan`).
        step: the train step.
        replay: ``output -> StepModel`` replaying the last stage's output.
        on_logits: the evaluation's logits observer, or None.
        logged / logits / losses / divided: by micro-batch index: the step's logged
            values, the captured logits, the loss and the loss divided by the plan.
    """

    micro_batches: Sequence[dict[str, torch.Tensor]]
    plan: StepPlan
    step: Any
    replay: Callable[..., StepModel]
    on_logits: LogitsObserver | None = None
    logged: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    logits: dict[int, list[torch.Tensor]] = dataclasses.field(default_factory=dict)
    losses: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    divided: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The schedule's loss of one micro-batch: the step's loss divided by the plan (and,
        in training, scaled for the backward). ``target`` holds the micro-batch's index.

        Kept by index: a schedule's set-up also calls this once for micro-batch 0.
        """
        index = int(target[0].item())
        captured: list[torch.Tensor] = []
        model = self.replay(output, captured.append if self.on_logits is not None else None)
        loss, logged = run_train_step(self.step, self.micro_batches[index], model, self.plan)
        self.logged[index] = logged
        self.logits[index] = captured
        divided = self.plan.divided(loss)
        self.losses[index] = loss.detach().float()
        self.divided[index] = divided.detach().float()
        return divided * self.plan.backward_scale

    def in_order(self, values: dict[int, Any]) -> list[Any]:
        """``values`` by micro-batch index, in order."""
        return [values[i] for i in sorted(values)]


class StageMoERecords:
    """The MoE statistics of every micro-batch's forward on each of this rank's stages.

    Args:
        runner: the pipeline runner (its stage ids, parts and groups).
    """

    def __init__(self, runner: PipelineRunner) -> None:
        self.runner = runner
        self.forwards: dict[int, list[list[Any]]] = {}
        e = runner.engine
        for stage_id, part in zip(e.stage_ids, e.model_parts):

            def keep(module: Any, args: Any, output: Any, _stage: int = stage_id) -> None:
                stats = take_moe_layer_stats(module)
                if stats:  # already detached (MoEMLP.last_stats)
                    self.forwards.setdefault(_stage, []).append(stats)

            part.register_forward_hook(keep)

    def into(self, run: PipelineRun, n: int) -> None:
        """Every stage's MoE statistics of this call into the last stage's records (a collective)."""
        e = self.runner.engine
        mine = {
            stage: [[(i, {k: v.cpu() for k, v in st.items()}) for i, st in fwd] for fwd in forwards]
            for stage, forwards in self.forwards.items()
        }  # moved off the device once per step, not after every forward
        self.forwards = {}
        every: list[Any] = [None] * e.dims.pp
        dist.all_gather_object(every, mine, group=e.pp_group)
        if not e.has_last_stage or not run.logged:
            return
        per_mb: list[list[Any]] = [[] for _ in range(n)]
        for stages in every:
            for stage_id, forwards in stages.items():
                if len(forwards) == n + 1:  # a new schedule's set-up runs one first
                    forwards = forwards[1:]
                if len(forwards) != n:
                    raise RuntimeError(
                        f"pipeline stage {stage_id} recorded {len(forwards)} MoE forwards for "
                        f"{n} micro-batches"
                    )
                for i, stats in enumerate(forwards):
                    per_mb[i] += stats
        for i, logged in run.logged.items():
            logged.update(moe_records(per_mb[i]))


class PipelineRunner:
    """This rank's pipeline stages and schedules (module docstring).

    Args:
        engine: the :class:`~epochal.parallel.engine.ParallelEngine` whose parts are staged.
        moe: the model has mixture-of-experts layers (their records are gathered).
    """

    def __init__(self, engine: Any, *, moe: bool) -> None:
        self.engine = engine
        e = engine
        group = e.mesh["pp"].get_group()
        self.stages = [
            _stage_class()(
                part,
                idx,
                e.dims.num_stages,
                e.device,
                group=group,
                on_backward=functools.partial(self._after_backward, i),
            )
            for i, (idx, part) in enumerate(zip(e.stage_ids, e.model_parts))
        ]
        self._eval_stages: list[Any] = []
        self._schedules: dict[tuple[int, bool], Any] = {}
        self._run: PipelineRun | None = None
        self.moe = StageMoERecords(self) if moe else None

    def _after_backward(self, index: int) -> None:
        self.engine.sync.after_backward(index)

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        assert self._run is not None, "a pipeline schedule ran outside PipelineRunner.run"
        return self._run.loss(output, target)

    def _schedule(self, n_microbatches: int, train: bool) -> Any:
        """The schedule of ``n_microbatches`` for training or evaluation (each built once).

        Evaluation runs on its own ``PipelineStage`` objects over the same modules: a
        schedule that switches one set of stages between training and evaluation
        re-initialises them on every switch, and the training step after an evaluation
        then computed different gradients than one process does.
        """
        key = (n_microbatches, train)
        if key not in self._schedules:
            if train:
                stages = self.stages
            else:
                if not self._eval_stages:
                    from torch.distributed.pipelining import PipelineStage  # imports TorchDynamo

                    self._eval_stages = [
                        PipelineStage(
                            s.submod, s.stage_index, s.num_stages, s.device, group=s.group
                        )
                        for s in self.stages
                    ]
                stages = self._eval_stages
            self._schedules[key] = build_schedule(
                self.engine.config.pipeline_schedule, stages, n_microbatches, self._loss
            )
        return self._schedules[key]

    def _replay(self, training: bool) -> Callable[..., StepModel]:
        e = self.engine

        def replay(output: torch.Tensor, on_logits: Any) -> StepModel:
            return StepModel.replay(
                output,
                loss_group=e.loss_group,
                training=training,
                on_logits=on_logits,
                context_parallel=e.cp,
                vocab_size=e.model_config.softmax_vocab_size,
                canonical_degree=e.canonical_degree,
            )

        return replay

    def _inputs(
        self, micro_batches: Sequence[dict[str, torch.Tensor]], step: Any, plan: StepPlan
    ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], torch.Tensor | None]:
        """The schedule's positional inputs, per-stage keywords and target (micro-batch indices)."""
        e = self.engine
        args: list[torch.Tensor] = []
        kwargs: dict[str, torch.Tensor] = {}
        if e.has_first_stage:
            args.append(torch.cat([step.input_ids(mb) for mb in micro_batches]))
        if micro_batches:  # what every stage's forward takes besides tokens / hidden states
            per_mb = [step.stage_kwargs(mb) for mb in micro_batches]
            for key in per_mb[0]:
                kwargs[key] = torch.cat([kw[key] for kw in per_mb])
        if plan.seeds is not None:  # one per micro-batch; every stage keys its dropout with it
            kwargs[DROPOUT_SEED_KWARG] = torch.tensor(list(plan.seeds), device=e.device)
        target = None
        if e.has_last_stage:
            sizes = [int(step.input_ids(mb).shape[0]) for mb in micro_batches]
            target = torch.repeat_interleave(
                torch.arange(len(sizes), device=e.device), torch.tensor(sizes, device=e.device)
            )
        return args, kwargs, target

    def run(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        plan: StepPlan,
        step: Any,
        on_logits: LogitsObserver | None = None,
    ) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """One global batch of this data-parallel rank through the schedule (every stage together).

        Returns:
            The step loss (training) or the evaluation loss, the same on every pipeline
            rank, and the logged values of the micro-batches (on the last stage; empty
            elsewhere).
        """
        e, n = self.engine, plan.num_microbatches
        schedule = self._schedule(n, plan.training)
        args, kwargs, target = self._inputs(micro_batches, step, plan)
        run = PipelineRun(micro_batches, plan, step, self._replay(plan.training), on_logits)
        losses: list[torch.Tensor] | None = [] if target is not None else None
        self._run = run
        try:
            if plan.training:
                schedule.step(*args, target=target, losses=losses, return_outputs=False, **kwargs)
            else:
                schedule.eval(*args, target=target, losses=losses, **kwargs)
        finally:
            self._run = None
        if self.moe is not None:
            self.moe.into(run, n)
        if on_logits is not None:  # in micro-batch order, once each
            for i in sorted(run.logged):
                observe_logits(on_logits, micro_batches[i], run.logits[i], run.logged[i])
        total = e.sync.pipeline_loss(
            run.in_order(run.losses), run.in_order(run.divided), plan.training
        )
        return total, run.in_order(run.logged)
