"""``ParallelEngine``: builds the parallel model and runs one step's forward/backward under any layout.

Composition order (torchtitan's): pipeline split -> tensor/sequence parallel ->
activation recompute -> ``torch.compile`` -> data parallel (FSDP2) -> pipeline
schedule. The trainer keeps its loop; it asks the engine for the model parts,
hands it the micro-batches of a step and calls its gradient clipping (see
:mod:`epochal.train.trainer`).

One step (:meth:`ParallelEngine.forward_backward`): the trainer's
:class:`~epochal.parallel.step_plan.StepPlan` says what each micro-batch loss is
divided and scaled by and its dropout seed; every micro-batch goes through the train
step (unpipelined here, or through :class:`~epochal.parallel.pipeline_step.PipelineRunner`);
the gradient synchronisation chosen when the engine is built
(:mod:`epochal.parallel.grad_sync`: Megatron's, or the exact one of
``exact_sync``) makes the gradients final, the step loss the same on every rank
and clips. Loss semantics are the trainer's (Megatron's default): each micro-batch's
loss is its token mean under ``loss_mask``, divided by the number of micro-batches; the
step loss is the mean over the whole global batch. With ``exact_sync`` the same
numbers come out under every data-parallel size, accumulation and pipeline split (see
``docs/concepts/layout-invariance.md``).

Batches: every rank of a data-parallel group (all its tensor-parallel and
pipeline ranks) reads the same micro-batches — the data layer is deterministic
per ``(seed, sample index, data-parallel rank)``, so no broadcast is needed.
Pipeline ranks that hold neither the first nor the last stage need no input
(unless per-document ``position_ids``/``attention_mask`` are used, which every
stage needs): :attr:`ParallelEngine.needs_batches` tells the trainer.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.model.init import canonical_name
from epochal.model.layers.moe import set_moe_aux_grad_factor
from epochal.parallel.canonical_context import HeadExchangeAttention
from epochal.parallel.canonical_plan import install_canonical
from epochal.parallel.canonical_step_sum import begin_step_sums, step_sums_order
from epochal.parallel.config import ParallelConfig
from epochal.parallel.context_parallel import (
    ContextParallel,
    apply_context_parallel,
    context_seed,
    resolve_exchange,
)
from epochal.parallel.context_ring import RingAttention
from epochal.parallel.data_parallel import apply_data_parallel
from epochal.parallel.dims import ParallelDims
from epochal.parallel.dropout_keys import (
    install_keyed_dropout,
    preserved_rng,
    seed_micro_batch,
)
from epochal.parallel.expert_parallel import ExpertParallel
from epochal.parallel.grad_sync import PlainGradSync, finalize_grads, gradient_sync
from epochal.parallel.logged import ordered_logged
from epochal.parallel.model_support import check_model_layout
from epochal.parallel.part_wrappers import autocast_forward, compile_part
from epochal.parallel.pipeline import (
    EmbeddingGroup,
    split_stage_module,
    stage_indices,
    stage_layer_counts,
    stage_layer_ranges,
)
from epochal.parallel.pipeline_step import PipelineRunner
from epochal.parallel.recompute import recompute_part
from epochal.parallel.step_model import LogitsObserver, StepModel, run_train_step
from epochal.parallel.step_plan import StepPlan
from epochal.parallel.tensor_parallel import apply_tensor_parallel

__all__ = ["LossFn", "ParallelEngine", "compile_part", "finalize_grads"]

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ParallelEngine:
    """The model of one rank under a parallel layout, and how to run a step on it.

    Args:
        config: the ``[parallel]`` section.
        model_config: the model.
        dims: the layout (from :meth:`ParallelDims.from_config`).
        mesh: the ``(pp, dp, cp, tp)`` device mesh (``dims.build_mesh()``); None only
            for a single process.
        device: this rank's device.
        seed: initialization seed (same weights as the single-process model).
        compile: ``torch.compile`` each transformer block (after TP and recompute).
        custom_loss: a user loss function is used: the logits it receives are
            gathered over the vocabulary (no vocabulary-parallel loss).
        bf16: run forwards under bfloat16 autocast (pipeline stages wrap their
            forward; otherwise :meth:`forward_backward` does).
        fp16: the same with float16 (the step plan's ``loss_scale`` scales the backward).
        exact_sync: the exact gradient synchronisation (bit-identical results
            under any data-parallel size and accumulation, :mod:`epochal.parallel.grad_sync`).
        frozen: parameter names (canonical) that are not trained: they get
            ``requires_grad=False`` before data parallelism wraps the parts.
    """

    def __init__(
        self,
        config: ParallelConfig,
        model_config: ModelConfig,
        dims: ParallelDims,
        mesh: DeviceMesh | None,
        *,
        device: torch.device,
        seed: int,
        compile: bool = False,
        custom_loss: bool = False,
        bf16: bool = False,
        fp16: bool = False,
        exact_sync: bool = False,
        canonical_degree: int = 0,
        frozen: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.frozen = frozen
        #: dropout keyed by the micro-batch (the exact synchronisation's, installed per part)
        self.keyed_dropout = exact_sync
        #: the invariance degree the model computes in (0: none; :mod:`epochal.parallel.canonical`)
        self.canonical_degree = canonical_degree
        self.model_config = model_config
        self.dims = dims
        self.mesh = mesh
        self.device = device
        self.seed = seed
        self.compile = compile
        if bf16 and fp16:
            raise ValueError("bf16 and fp16 are exclusive")
        self.autocast_dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else None
        self.loss_parallel = config.loss_parallel and not custom_loss and dims.tp > 1
        if mesh is None and dims.world_size > 1:
            raise ValueError(f"layout {dims} needs a device mesh")
        check_model_layout(
            model_config,
            dims,
            sequence_parallel=config.sequence_parallel,
            canonical=bool(canonical_degree),
        )
        coords = (
            {"pp": 0, "dp": 0, "cp": 0, "tp": 0}
            if mesh is None
            else {n: mesh[n].get_local_rank() for n in ("pp", "dp", "cp", "tp")}
        )
        self.pp_rank, self.dp_rank, self.tp_rank = coords["pp"], coords["dp"], coords["tp"]
        self.cp_rank = coords["cp"]
        #: context parallelism (:mod:`epochal.parallel.context_parallel`), None without
        self.cp: ContextParallel | None = None
        if dims.cp > 1:
            assert mesh is not None
            ContextParallel.check_training(
                custom_loss=custom_loss,
                head=model_config.head,
                canonical=bool(canonical_degree),
            )
            self.cp = ContextParallel(mesh["cp"].get_group())
        #: expert parallelism (:mod:`epochal.parallel.expert_parallel`), None without
        self.ep = ExpertParallel(dims, invariant=exact_sync) if dims.ep > 1 else None
        counts = stage_layer_counts(
            model_config.num_layers,
            dims.pp,
            dims.vpp,
            first=config.decoder_first_pipeline_num_layers,
            last=config.decoder_last_pipeline_num_layers,
        )
        self.layer_ranges = stage_layer_ranges(counts)
        self.stage_ids = stage_indices(self.pp_rank, dims.pp, dims.vpp)
        self.model_parts = [self._build_part(i) for i in self.stage_ids]
        self.tied = model_config.tie_embeddings and dims.pp > 1
        self.embedding_group = EmbeddingGroup(mesh, self.tied)
        self.logged: list[dict[str, Any]] = []
        #: with the exact synchronisation: the last call's per-micro-batch losses, global order
        self.micro_batch_losses: list[float] = []
        moe = getattr(model_config, "num_experts", None) is not None
        #: the pipeline stages and schedules (None without pipeline parallelism)
        self.pipeline = PipelineRunner(self, moe=moe) if dims.pp > 1 else None
        #: the gradient synchronisation (:mod:`epochal.parallel.grad_sync`)
        self.sync: PlainGradSync = gradient_sync(self, exact=exact_sync)

    # ------------------------------------------------------------------ building
    @property
    def has_first_stage(self) -> bool:
        """This rank holds stage 0 (the embeddings; it needs token ids)."""
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        """This rank holds the last stage (the head; it needs labels and loss masks)."""
        return self.dims.num_stages - 1 in self.stage_ids

    def needs_batches(self, per_document: bool = False) -> bool:
        """Whether this rank must read the data (False for middle pipeline ranks).

        Args:
            per_document: batches carry ``position_ids``/``attention_mask`` that every stage uses.
        """
        return per_document or self.has_first_stage or self.has_last_stage

    @property
    def tp_group(self) -> dist.ProcessGroup | None:
        """The tensor-parallel process group (None without tensor parallelism)."""
        return self.mesh["tp"].get_group() if self.mesh is not None and self.dims.tp > 1 else None

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        """The pipeline process group (None without pipeline parallelism)."""
        return self.mesh["pp"].get_group() if self.mesh is not None and self.dims.pp > 1 else None

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The data-parallel process group (None without data parallelism)."""
        return self.mesh["dp"].get_group() if self.mesh is not None and self.dims.dp > 1 else None

    def _build_part(self, stage_idx: int) -> nn.Module:
        cfg, pc = self.model_config, self.config
        with torch.device("meta"):
            whole = build_model(cfg, seed=self.seed)
        last = self.dims.num_stages - 1
        if self.dims.num_stages > 1:
            part = split_stage_module(
                whole,
                self.layer_ranges[stage_idx],
                is_first=stage_idx == 0,
                is_last=stage_idx == last,
            )
        else:
            part = whole
        if self.ep is not None:  # on the meta device: only this rank's experts are materialised
            self.ep.shard(part)
        part.to_empty(device=self.device)
        part.init_weights(seed=self.seed)
        if self.canonical_degree:
            assert self.mesh is not None or self.dims.tp == 1
            install_canonical(
                part,
                self.canonical_degree,
                self.mesh["tp"] if self.dims.tp > 1 else None,
                sequence_parallel=pc.sequence_parallel,
                gather_logits=not self.loss_parallel,
                cp_group=self.cp.group if self.cp is not None else None,
                context_degree=pc.invariant_context_degree,
                packed_row=self.cp.packed_row if self.cp is not None else None,
                # not under FSDP2 (data parallelism), which reduces each unit in its own
                # backward hook, nor torch.compile, which would trace the node's bookkeeping
                defer_completion=self.dims.dp == 1 and not self.compile,
                step_sums=step_sums_order(pc, cp=self.dims.cp, compile=self.compile),
            )
        elif self.dims.tp > 1:
            assert self.mesh is not None
            apply_tensor_parallel(
                part,
                self.mesh["tp"],
                sequence_parallel=pc.sequence_parallel,
                loss_parallel=self.loss_parallel,
            )
        if self.cp is not None:
            if not self.canonical_degree:  # canonical: heads exchanged
                core = cross = None  # allgather: every rank's keys and values
                exchange = resolve_exchange(
                    pc.context_parallel_exchange, cfg, tp=self.dims.tp, cp=self.dims.cp
                )
                if exchange == "a2a":  # whole heads over the whole sequence
                    core = functools.partial(
                        HeadExchangeAttention, self.cp.group, packed_row=self.cp.packed_row
                    )
                    cross = core  # T5's cross-attention: its heads over both whole sequences
                elif exchange == "p2p":  # keys and values around a ring
                    ring = RingAttention(self.cp.group)
                    core = lambda _attention: ring  # noqa: E731
                apply_context_parallel(part, self.cp, core, cross)
            if self.dims.num_stages > 1:  # the schedule feeds the stage whole micro-batches
                self.cp.install_stage_hook(part, is_first=stage_idx == 0)
        for name, param in part.named_parameters():
            if canonical_name(name, cfg) in self.frozen:
                param.requires_grad_(False)
        unit_keys = recompute_part(part, pc)
        if self.compile:
            compile_part(part, unit_keys, tensor_parallel=self.dims.tp > 1)
        if self.keyed_dropout:
            install_keyed_dropout(part)
        if self.autocast_dtype is not None and self.dims.pp > 1:
            autocast_forward(part, self.autocast_dtype, self.device.type)
        if self.dims.dp > 1:
            assert self.mesh is not None
            part = apply_data_parallel(part, self.mesh["dp"], pc.dp_sharding, unit_keys=unit_keys)
        return part

    def stage_part(self, stage_idx: int) -> nn.Module:
        """This rank's model part of pipeline stage ``stage_idx`` (it must hold it)."""
        return self.model_parts[self.stage_ids.index(stage_idx)]

    # -------------------------------------------------------------------- loss
    def _step_model(self, part: nn.Module) -> StepModel:
        return StepModel(
            part,
            loss_group=self.loss_group,
            module=part,
            context_parallel=self.cp,
            canonical_degree=self.canonical_degree,
        )

    @property
    def loss_group(self) -> dist.ProcessGroup | None:
        """The group the logits are sharded over (vocabulary-parallel loss), else None."""
        return self.tp_group if self.loss_parallel else None

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 / fp16 autocast for the unpipelined forward (pipeline stages wrap their own)."""
        if self.autocast_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.autocast_dtype)
        return contextlib.nullcontext()

    def step_plan(
        self,
        num_microbatches: int,
        *,
        loss_scale: float = 1.0,
        seeds: Sequence[int] | None = None,
        loss_tokens: float | None = None,
    ) -> StepPlan:
        """The plan of a training step of ``num_microbatches`` on this rank (module docstring).

        Args:
            num_microbatches: this rank's micro-batches.
            loss_scale: the fp16 scaler's scale (1.0 without fp16).
            seeds: the micro-batches' dropout seeds (exact synchronisation), or None.
            loss_tokens: the global batch's loss tokens for a global token mean, or None.
        """
        return StepPlan.training_step(
            num_microbatches,
            divisor=self.sync.loss_divisor(num_microbatches),
            loss_scale=loss_scale,
            global_micro_batches=num_microbatches * self.dims.dp,
            loss_tokens=loss_tokens,
            seeds=seeds,
        )

    # ------------------------------------------------------------------- steps
    def forward_backward(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        plan: StepPlan | None = None,
        *,
        step: Any,
        num_microbatches: int | None = None,
    ) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches of one step; gradients are final after it.

        Args:
            micro_batches: the micro-batches of this data-parallel rank, on the
                device, as the train step reads them (GPT: ``tokens``, ``labels`` int64
                ``[b, s]``, ``loss_mask`` float ``[b, s]``, optionally ``position_ids``
                / ``attention_mask``). Middle pipeline ranks may pass an empty list.
            plan: the step plan (:meth:`step_plan`); None: :meth:`step_plan` of
                ``len(micro_batches)`` (or ``num_microbatches``) without fp16, seeds or a
                global token count.
            step: the train step (``forward_step(data_iterator, model) -> (output,
                loss_func)``, see ``epochal.train.steps``) run for every micro-batch; its
                logged values are then in :attr:`logged` (see :meth:`reduce_logged`).
            num_microbatches: the count when ``micro_batches`` is empty and no plan is given.

        Returns:
            The step loss (mean of the micro-batch losses over the global batch),
            a detached float32 scalar, the same on every rank.
        """
        if plan is None:
            n = len(micro_batches) if micro_batches else int(num_microbatches or 0)
            if n < 1:
                raise ValueError("forward_backward needs at least one micro-batch")
            plan = self.step_plan(n)
        self.logged = []
        begin_step_sums(self.model_parts)
        for part in self.model_parts:  # the balance losses' gradient
            set_moe_aux_grad_factor(part, plan.aux_grad_factor)
        with preserved_rng(self.device) if plan.seeds is not None else contextlib.nullcontext():
            if self.pipeline is not None:
                total, self.logged = self.pipeline.run(micro_batches, plan, step)
            else:
                total = self._unpipelined_step(micro_batches, plan, step)
        self.sync.finish()
        return total

    def _unpipelined_step(
        self, micro_batches: Sequence[dict[str, torch.Tensor]], plan: StepPlan, step: Any
    ) -> torch.Tensor:
        n, sync = plan.num_microbatches, self.sync
        model = self._step_model(self.model_parts[0])
        divided = []
        for i, mb in enumerate(micro_batches):
            sync.before_forward(i, n)
            if plan.seeds is not None:
                seed_micro_batch(self._dropout_seed(plan.seeds[i]), self.device)
            with self._autocast():
                loss, logged = run_train_step(step, mb, model, plan)
            self.logged.append(logged)
            scaled = plan.divided(loss)
            sync.before_backward()
            (scaled * plan.loss_scale).backward()
            sync.after_backward(0)
            divided.append(scaled.detach().float())
        return sync.step_loss(divided)

    def _dropout_seed(self, seed: int) -> int:
        """A micro-batch's dropout seed on this rank.

        In canonical units every context-parallel rank draws the whole sequence's masks
        and keeps its positions' (the same seed); otherwise the rank is folded in
        (:func:`~epochal.parallel.context_parallel.context_seed`).
        """
        return seed if self.canonical_degree else context_seed(seed, self.cp_rank)

    def reduce_logged(self) -> dict[str, float]:
        """The last step's logged values, averaged over micro-batches and data-parallel ranks.

        A collective over the pipeline and data-parallel groups: every rank calls it
        after :meth:`forward_backward` / :meth:`eval_loss`.
        """
        return self.sync.reduce_logged(self.logged)

    def ordered_logged(self) -> list[dict[str, float]]:
        """The last step's logged values of every micro-batch, in global order (a collective)."""
        return ordered_logged(
            self.logged, pp_group=self.pp_group, pp_src=self.dims.pp - 1, dp_group=self.dp_group
        )

    @torch.no_grad()
    def eval_loss(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        *,
        step: Any,
        num_microbatches: int | None = None,
        on_logits: LogitsObserver | None = None,
        loss_tokens: float | None = None,
    ) -> torch.Tensor:
        """Mean loss of one global batch without gradients (same on every rank); see :meth:`forward_backward`.

        Args:
            on_logits: called on the ranks holding the last stage with each
                micro-batch and its whole logits ``[b, s, V]`` (padded vocabulary), in
                micro-batch order; a dict it returns is logged with the step's values
                (see :meth:`reduce_logged`).
            loss_tokens: the global batch's loss tokens for a global token mean
                (``num_items_in_batch``), or None (each micro-batch's mean).
        """
        n = len(micro_batches) if micro_batches else int(num_microbatches or 0)
        plan = StepPlan.evaluation(
            n, global_micro_batches=n * self.dims.dp, loss_tokens=loss_tokens
        )
        self.logged = []
        if self.pipeline is not None:
            total, self.logged = self.pipeline.run(micro_batches, plan, step, on_logits)
            return total
        model = self._step_model(self.model_parts[0])
        losses = []
        for mb in micro_batches:
            with self._autocast():
                loss, logged = run_train_step(step, mb, model, plan, on_logits)
            self.logged.append(logged)
            losses.append(loss.float())
        return self.sync.eval_loss(losses)

    # -------------------------------------------------------------- gradients
    def parameters(self) -> list[torch.Tensor]:
        """This rank's parameters (all parts; each once)."""
        seen: set[int] = set()
        out = []
        for part in self.model_parts:
            for p in part.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def duplicated_parameters(self) -> list[torch.Tensor]:
        """Parameters that are a second copy of another rank's (the last stage's tied head)."""
        if self.tied and self.has_last_stage:
            return [self.stage_part(self.dims.num_stages - 1).output.weight]
        return []

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip all gradients to the global L2 norm ``max_norm`` (0 = measure only); return the norm."""
        return self.sync.clip_norm(max_norm)
