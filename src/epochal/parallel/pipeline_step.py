"""The engine's pipeline-parallel step: the schedule, each micro-batch's loss, the step's losses.

:class:`PipelineSteps` is a mixin of :class:`~epochal.parallel.engine.ParallelEngine`
(its state is the engine's): :meth:`PipelineSteps._pipeline_step` runs one global
batch of this data-parallel rank through a ``torch.distributed.pipelining``
schedule (training or evaluation). The last stage computes each micro-batch's
loss in :meth:`PipelineSteps._pipeline_loss` (the train step on a replay of the
stage's output, or a plain loss function), divided by the number of
micro-batches; the step loss is broadcast from the last stage to every
pipeline rank. With ``layout_invariant`` the divisor is the global number of
micro-batches and the losses are summed in the global micro-batch order
(:mod:`epochal.parallel.global_order`); the micro-batch seeds of keyed dropout
reach every stage as a keyword (:mod:`epochal.parallel.dropout_keys`).

Mixture-of-experts records: each micro-batch's records cover every MoE layer, as one
process's do. A stage's layers keep their statistics after each forward (in
micro-batch order, the schedules' order of forwards on one stage; a schedule's first
step is preceded by one forward of its set-up, which is left out); after the
schedule they are gathered over the pipeline group and the last stage turns each
micro-batch's layers into its records (:func:`~epochal.model.layers.moe.moe_records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from epochal._masked_mean import masked_mean
from epochal.model.layers.moe import moe_records, set_moe_aux_grad_factor, take_moe_layer_stats
from epochal.parallel.dropout_keys import DROPOUT_SEED_KWARG
from epochal.parallel.global_order import gather_in_order, sequential_sum
from epochal.parallel.pipeline import build_schedule
from epochal.parallel.step_model import LogitsObserver, StepModel, observe_logits, run_train_step

__all__ = ["PipelineSteps"]


class PipelineSteps:
    """Pipeline schedule steps of :class:`~epochal.parallel.engine.ParallelEngine` (a mixin)."""

    def _build_stages(self, mesh: Any, device: torch.device) -> list[Any]:
        """This rank's ``PipelineStage`` objects over :attr:`model_parts` (none without pipelining)."""
        if self.dims.pp == 1:
            return []
        from torch.distributed.pipelining import PipelineStage  # imports TorchDynamo

        group = mesh["pp"].get_group()
        return [
            PipelineStage(part, idx, self.dims.num_stages, device, group=group)
            for idx, part in zip(self.stage_ids, self.model_parts)
        ]

    def _install_moe_stage_records(self, moe: bool) -> None:
        """Keep the MoE statistics of every micro-batch's forward on each stage (pipelines with MoE)."""
        self._pp_moe: dict[int, list[list[Any]]] | None = None
        if not (moe and self.dims.pp > 1):
            return
        self._pp_moe = {}
        for stage_id, part in zip(self.stage_ids, self.model_parts):

            def keep(module: Any, args: Any, output: Any, _stage: int = stage_id) -> None:
                stats = take_moe_layer_stats(module)
                if stats:  # already detached (MoEMLP.last_stats)
                    self._pp_moe.setdefault(_stage, []).append(stats)

            part.register_forward_hook(keep)

    def _moe_stage_records(self) -> None:
        """Every stage's MoE statistics of this step into the last stage's records (a collective)."""
        if self._pp_moe is None:
            return
        mine = {
            stage: [[(i, {k: v.cpu() for k, v in st.items()}) for i, st in fwd] for fwd in forwards]
            for stage, forwards in self._pp_moe.items()
        }  # moved off the device once per step, not after every forward
        self._pp_moe = {}
        every: list[Any] = [None] * self.dims.pp
        dist.all_gather_object(every, mine, group=self.pp_group)
        if not self.has_last_stage or not self._pp_logged:
            return
        per_mb: list[list[Any]] = [[] for _ in range(self._pp_n)]
        for stages in every:
            for stage_id, forwards in stages.items():
                if len(forwards) == self._pp_n + 1:  # a new schedule's set-up runs one first
                    forwards = forwards[1:]
                if len(forwards) != self._pp_n:
                    raise RuntimeError(
                        f"pipeline stage {stage_id} recorded {len(forwards)} MoE forwards for "
                        f"{self._pp_n} micro-batches"
                    )
                for i, stats in enumerate(forwards):
                    per_mb[i] += stats
        for i, logged in self._pp_logged.items():
            logged.update(moe_records(per_mb[i]))

    def _pipeline_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self._step is not None:
            # target holds the micro-batch's index (one value per sample).
            index = int(target[0].item())
            mb = self._pp_micro_batches[index]
            captured: list[torch.Tensor] = []
            model = StepModel.replay(
                output,
                loss_group=self.loss_group,
                training=self._pp_training,
                on_logits=captured.append if self._pp_on_logits is not None else None,
                context_parallel=self.cp,
                vocab_size=self.model_config.softmax_vocab_size,
            )
            # a replay has no module: MoE records are kept per stage (_moe_stage_records)
            loss, logged = run_train_step(self._step, mb, model)
            # By index: the schedule's set-up also calls this once for micro-batch 0.
            self._pp_logged[index] = logged
            self._pp_logits[index] = captured
            return self._scale_pipeline_loss(loss, index)
        labels = target[..., 0].long()
        mask = target[..., 1].float()
        if self.cp is not None:  # this rank's chunks of the logits: the whole sequence's losses
            replay = StepModel.replay(
                output,
                loss_group=self.loss_group,
                training=True,
                context_parallel=self.cp,
                vocab_size=self.model_config.softmax_vocab_size,
            )
            losses = replay(labels=labels).flatten()
            mask = mask.flatten().to(losses.dtype)
            loss = masked_mean(losses, mask)
        else:
            loss = self._loss(self._loss_fn, labels, output, mask)
        index = int(target[0, 0, 2].item()) if self.layout_invariant else 0  # see _pipeline_step
        return self._scale_pipeline_loss(loss, index)

    def _scale_pipeline_loss(self, loss: torch.Tensor, index: int) -> torch.Tensor:
        """Plain: ``loss * fp16_scale / n``; layout-invariant: ``(loss / M) * fp16_scale``, as one process."""
        if not self.layout_invariant:
            return loss * self._micro_batch_factor
        scaled = loss / (self._pp_n * self.dims.dp)
        self._pp_losses[index] = (scaled if self._pp_training else loss).detach().float()
        return scaled * (self.fp16_scale if self._pp_training else 1.0)

    def _schedule(self, n_microbatches: int, train: bool) -> Any:
        """The schedule of ``n_microbatches`` for training or evaluation (each built once).

        Evaluation runs on its own :class:`PipelineStage` objects over the same
        modules: a schedule that switches one set of stages between training and
        evaluation re-initialises them on every switch, and the training step after
        an evaluation then computed different gradients than one process does.
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
                self.config.pipeline_schedule, stages, n_microbatches, self._pipeline_loss
            )
        return self._schedules[key]

    def _pipeline_step(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        n: int,
        loss_fn: Any,
        per_document: bool,
        *,
        train: bool,
        step: Any = None,
        on_logits: LogitsObserver | None = None,
        seeds: Sequence[int] | None = None,
    ) -> torch.Tensor:
        self._loss_fn = loss_fn
        self._pp_on_logits = on_logits
        fp16_scale = self.fp16_scale if train else 1.0
        self._micro_batch_factor = fp16_scale / n
        moe_factor = fp16_scale / (n * self.dims.dp) if self.layout_invariant else fp16_scale / n
        for part in self.model_parts:
            set_moe_aux_grad_factor(part, moe_factor)
        self._pp_n, self._pp_losses = n, {}
        self._step = step
        self._pp_micro_batches = micro_batches
        self._pp_training = train
        self._pp_logged = {}
        self._pp_logits = {}
        schedule = self._schedule(n, train)
        args: list[torch.Tensor] = []
        kwargs: dict[str, torch.Tensor] = {}
        target = None
        input_ids = step.input_ids if step is not None else (lambda mb: mb["tokens"])
        if self.has_first_stage:
            args.append(torch.cat([input_ids(mb) for mb in micro_batches]))
        if step is not None and micro_batches:
            # What every stage's forward takes besides tokens / hidden states.
            per_mb = [step.stage_kwargs(mb) for mb in micro_batches]
            for key in per_mb[0]:
                kwargs[key] = torch.cat([kw[key] for kw in per_mb])
        elif per_document and micro_batches:
            for key in ("position_ids", "attention_mask"):
                if key in micro_batches[0]:
                    kwargs[key] = torch.cat([mb[key] for mb in micro_batches])
        if seeds is not None:  # one per micro-batch; every stage keys its dropout with it
            kwargs[DROPOUT_SEED_KWARG] = torch.tensor(list(seeds), device=self.device)
        losses: list[torch.Tensor] | None = None
        if self.has_last_stage and step is not None:
            sizes = [int(input_ids(mb).shape[0]) for mb in micro_batches]
            target = torch.repeat_interleave(
                torch.arange(n, device=self.device), torch.tensor(sizes, device=self.device)
            )
            losses = []
        elif self.has_last_stage:
            labels = torch.cat([mb["labels"] for mb in micro_batches]).double()
            mask = torch.cat([mb["loss_mask"] for mb in micro_batches]).double()
            target = torch.stack([labels, mask], dim=-1)
            if self.layout_invariant:  # a third channel: the micro-batch's index
                rows = [int(mb["labels"].shape[0]) for mb in micro_batches]
                index = torch.repeat_interleave(torch.arange(n), torch.tensor(rows)).double()
                index = index.to(labels.device)[:, None].expand_as(labels)
                target = torch.cat([target, index[..., None]], dim=-1)
            losses = []
        if train:
            schedule.step(*args, target=target, losses=losses, return_outputs=False, **kwargs)
        else:
            schedule.eval(*args, target=target, losses=losses, **kwargs)
        self._moe_stage_records()
        if on_logits is not None:  # in micro-batch order, once each
            for i in sorted(self._pp_logged):
                observe_logits(on_logits, micro_batches[i], self._pp_logits[i], self._pp_logged[i])
        self.logged = [self._pp_logged[i] for i in sorted(self._pp_logged)]
        self._step = None
        self._pp_on_logits = None
        self._pp_logits = {}
        self._pp_micro_batches = ()
        total = torch.zeros((), device=self.device)
        if self.layout_invariant:
            total = self._ordered_pipeline_losses(n, train)
        elif losses:  # the schedule's losses carry the fp16 loss scale (a power of two): exact
            total = torch.stack([loss.detach().float() for loss in losses]).sum().to(self.device)
            total = total / fp16_scale
        assert self.mesh is not None
        dist.broadcast(total, group=self.pp_group, group_src=self.dims.pp - 1)
        return total

    def _ordered_pipeline_losses(self, n: int, train: bool) -> torch.Tensor:
        """Layout-invariant: the last stage's per-micro-batch losses in global order, on every stage.

        Sets :attr:`micro_batch_losses`; returns the step loss (training: the
        sequential sum of the scaled losses; evaluation: their mean).
        """
        values: list[float] = []
        if self.has_last_stage:
            mine = torch.stack([self._pp_losses[i] for i in range(n)]).to(self.device)
            values = gather_in_order(mine, self.dp_group).tolist()
        box: list[Any] = [values]
        dist.broadcast_object_list(box, group=self.pp_group, group_src=self.dims.pp - 1)
        self.micro_batch_losses = box[0]
        ordered = torch.tensor(self.micro_batch_losses, dtype=torch.float32, device=self.device)
        return sequential_sum(ordered) if train else sequential_sum(ordered) / len(ordered)
