"""``ParallelEngine``: builds the parallel model and runs one step's forward/backward under any layout.

Composition order (torchtitan's): pipeline split -> tensor/sequence parallel ->
activation recompute -> ``torch.compile`` -> data parallel (FSDP2) -> pipeline
schedule. The trainer keeps its loop; it asks the engine for the model parts,
hands it the micro-batches of a step and calls its gradient clipping (see
:mod:`epochal.train.trainer`).

Loss semantics are the trainer's (Megatron's default): each micro-batch's loss is
its token mean under ``loss_mask``, divided by the number of micro-batches of
this data-parallel rank; gradients are averaged over data-parallel ranks. The
step loss returned by :meth:`ParallelEngine.forward_backward` is the mean over
the whole global batch, the same on every rank.

``layout_invariant``: the same numbers under every data-parallel size and
accumulation (see ``docs/concepts/layout-invariance.md``): each micro-batch's
loss is divided by the global number of micro-batches (the same value), the
gradients are accumulated in the global micro-batch order
(:mod:`epochal.parallel.ordered_reduce`), the step loss and logged values are
summed in that order (:mod:`epochal.parallel.global_order`), the gradient norm is
exact (:mod:`epochal.parallel.exact_norm`) and dropout is keyed by the sample
(:mod:`epochal.parallel.dropout_keys`).

Batches: every rank of a data-parallel group (all its tensor-parallel and
pipeline ranks) reads the same micro-batches — the data layer is deterministic
per ``(seed, sample index, data-parallel rank)``, so no broadcast is needed.
Pipeline ranks that hold neither the first nor the last stage need no input
(unless per-document ``position_ids``/``attention_mask`` are used, which every
stage needs): :attr:`ParallelEngine.needs_batches` tells the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from epochal._masked_mean import masked_mean
from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.model.init import canonical_name
from epochal.model.layers.moe import set_moe_aux_grad_factor
from epochal.parallel.config import ParallelConfig
from epochal.parallel.context_parallel import (
    ContextParallel,
    apply_context_parallel,
    context_seed,
)
from epochal.parallel.data_parallel import apply_data_parallel, set_gradient_sync
from epochal.parallel.dims import ParallelDims
from epochal.parallel.dropout_keys import (
    install_keyed_dropout,
    preserved_rng,
    seed_micro_batch,
)
from epochal.parallel.exact_norm import clip_grad_norm_exact
from epochal.parallel.expert_parallel import ExpertParallel
from epochal.parallel.global_order import gather_in_order, sequential_sum
from epochal.parallel.grad_clip import clip_grad_norm_parallel
from epochal.parallel.logged import ordered_logged, reduce_logged
from epochal.parallel.loss import masked_mean_loss_parallel
from epochal.parallel.model_support import check_model_layout
from epochal.parallel.ordered_reduce import OrderedGradReducer, finalize_partial_grads
from epochal.parallel.part_wrappers import autocast_forward, compile_part
from epochal.parallel.pipeline import (
    EmbeddingGroup,
    split_stage_module,
    stage_indices,
    stage_layer_counts,
    stage_layer_ranges,
)
from epochal.parallel.pipeline_step import PipelineSteps
from epochal.parallel.recompute import recompute_part
from epochal.parallel.step_model import (
    LogitsObserver,
    StepModel,
    run_train_step,
)
from epochal.parallel.tensor_parallel import apply_tensor_parallel

__all__ = ["LossFn", "ParallelEngine", "compile_part", "finalize_grads"]

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


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


class ParallelEngine(PipelineSteps):
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
        fp16: the same with float16 (the trainer scales the loss: :attr:`fp16_scale`).
        layout_invariant: compute bit-identical results under any data-parallel
            size and accumulation (module docstring; ``training.layout_invariant``).
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
        layout_invariant: bool = False,
        frozen: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.frozen = frozen
        self.layout_invariant = layout_invariant
        self.model_config = model_config
        self.dims = dims
        self.mesh = mesh
        self.device = device
        self.seed = seed
        self.compile = compile
        if bf16 and fp16:
            raise ValueError("bf16 and fp16 are exclusive")
        self.autocast_dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else None
        #: the fp16 loss scaler's scale, set by the trainer before each step: the training
        #: backward's loss multiplier (1.0 without fp16); the returned loss is not scaled.
        self.fp16_scale = 1.0
        self.loss_parallel = config.loss_parallel and not custom_loss and dims.tp > 1
        if mesh is None and dims.world_size > 1:
            raise ValueError(f"layout {dims} needs a device mesh")
        check_model_layout(model_config, dims, sequence_parallel=config.sequence_parallel)
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
            ContextParallel.check_training(custom_loss=custom_loss)
            self.cp = ContextParallel(mesh["cp"].get_group())
        #: expert parallelism (:mod:`epochal.parallel.expert_parallel`), None without
        self.ep = ExpertParallel(dims, invariant=layout_invariant) if dims.ep > 1 else None
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
        self.stages = self._build_stages(mesh, device)
        self._schedules: dict[tuple[int, bool], Any] = {}
        self._eval_stages: list[Any] = []
        self._loss_fn: LossFn | None = None
        #: a pipeline micro-batch's loss multiplier in the backward, ``fp16_scale / micro-batches``.
        self._micro_batch_factor = 1.0
        self._step: Any = None
        self._pp_micro_batches: Sequence[dict[str, torch.Tensor]] = ()
        self._pp_training = True
        self._pp_logged: dict[int, dict[str, Any]] = {}
        self._pp_on_logits: LogitsObserver | None = None
        self._pp_logits: dict[int, list[torch.Tensor]] = {}
        self._pp_losses: dict[int, torch.Tensor] = {}
        self._pp_n = 0
        self._install_moe_stage_records(getattr(model_config, "num_experts", None) is not None)
        self.logged: list[dict[str, Any]] = []
        #: layout_invariant: the last call's per-micro-batch losses, global order, every rank.
        self.micro_batch_losses: list[float] = []
        self.reducer = self._build_reducer() if layout_invariant else None

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
        if self.dims.tp > 1:
            assert self.mesh is not None
            apply_tensor_parallel(
                part,
                self.mesh["tp"],
                sequence_parallel=pc.sequence_parallel,
                loss_parallel=self.loss_parallel,
            )
        if self.cp is not None:
            apply_context_parallel(part, self.cp)
            if self.dims.num_stages > 1:  # the schedule feeds the stage whole micro-batches
                self.cp.install_stage_hook(part, is_first=stage_idx == 0)
        for name, param in part.named_parameters():
            if canonical_name(name, cfg) in self.frozen:
                param.requires_grad_(False)
        unit_keys = recompute_part(part, pc)
        if self.compile:
            compile_part(part, unit_keys, tensor_parallel=self.dims.tp > 1)
        if self.layout_invariant:
            install_keyed_dropout(part)
        if self.autocast_dtype is not None and self.dims.pp > 1:
            autocast_forward(part, self.autocast_dtype, self.device.type)
        if self.dims.dp > 1:
            assert self.mesh is not None
            part = apply_data_parallel(part, self.mesh["dp"], pc.dp_sharding, unit_keys=unit_keys)
        return part

    def _build_reducer(self) -> OrderedGradReducer | None:
        """The ordered gradient reduction (data parallelism, tied pipeline copies), or None."""
        tied = None
        if self.tied and self.has_first_stage:
            tied = ("first", self.model_parts[self.stage_ids.index(0)].tok_embeddings.weight)
        elif self.tied and self.has_last_stage:
            last = self.model_parts[self.stage_ids.index(self.dims.num_stages - 1)]
            tied = ("last", last.output.weight)
        reducer = OrderedGradReducer(
            self.model_parts,
            self.dp_group,
            replicate=self.config.dp_sharding == "none",
            tied=tied,
            tied_group=self.embedding_group.group,
        )
        if not reducer.active:
            return None
        for index, stage in enumerate(self.stages):  # after each stage's backward of a micro-batch
            backward = stage.backward_one_chunk

            def hooked(*args: Any, _b: Any = backward, _i: int = index, **kwargs: Any) -> Any:
                out = _b(*args, **kwargs)
                reducer.after_backward(_i)
                return out

            stage.backward_one_chunk = hooked  # type: ignore[method-assign]
        return reducer

    # -------------------------------------------------------------------- loss
    def _loss(
        self, loss_fn: LossFn | None, labels: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if loss_fn is not None:
            return loss_fn(labels, logits, mask)
        group, vocab = self.loss_group, self.model_config.softmax_vocab_size
        return masked_mean_loss_parallel(labels, logits, mask, group, vocab)

    def _step_model(self, part: nn.Module) -> StepModel:
        return StepModel(part, loss_group=self.loss_group, module=part, context_parallel=self.cp)

    def _plain_loss(
        self, model: StepModel, mb: dict[str, torch.Tensor], loss_fn: LossFn | None, per_doc: bool
    ) -> torch.Tensor:
        """A micro-batch's loss without a train step: ``loss_fn``, or the token mean."""
        kwargs = self._forward_kwargs(mb, per_doc)
        if self.cp is not None:  # per-token losses of the whole sequence (context_parallel.py)
            losses = model(mb["tokens"], labels=mb["labels"], **kwargs).flatten()
            mask = mb["loss_mask"].flatten().to(losses.dtype)
            return masked_mean(losses, mask)
        logits = model.module(mb["tokens"], **kwargs)  # type: ignore[misc]
        return self._loss(loss_fn, mb["labels"], logits, mb["loss_mask"])

    @property
    def loss_group(self) -> dist.ProcessGroup | None:
        """The group the logits are sharded over (vocabulary-parallel loss), else None."""
        return self.tp_group if self.loss_parallel else None

    def _step_loss(
        self,
        step: Any,
        mb: dict[str, torch.Tensor],
        model: StepModel,
        on_logits: LogitsObserver | None = None,
    ) -> torch.Tensor:
        """One micro-batch through a train step: its loss (its logged values kept; what
        ``on_logits`` returns among them)."""
        loss, logged = run_train_step(step, mb, model, on_logits)
        self.logged.append(logged)
        return loss

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 / fp16 autocast for the unpipelined forward (pipeline stages wrap their own)."""
        if self.autocast_dtype is not None:
            return torch.autocast(self.device.type, dtype=self.autocast_dtype)
        return contextlib.nullcontext()

    @staticmethod
    def _forward_kwargs(mb: dict[str, torch.Tensor], per_document: bool) -> dict[str, torch.Tensor]:
        kwargs = {}
        if per_document:
            for key in ("position_ids", "attention_mask"):
                if key in mb:
                    kwargs[key] = mb[key]
        return kwargs

    # ------------------------------------------------------------------- steps
    def forward_backward(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        *,
        num_microbatches: int | None = None,
        loss_fn: LossFn | None = None,
        per_document: bool = False,
        step: Any = None,
        micro_batch_seeds: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches of one step; gradients are final after it.

        Args:
            micro_batches: the micro-batches of this data-parallel rank, on the
                device, each a dict with ``tokens``, ``labels`` (int64 ``[b, s]``),
                ``loss_mask`` (float ``[b, s]``) and optionally ``position_ids`` /
                ``attention_mask``. Middle pipeline ranks may pass an empty list
                (give ``num_microbatches`` then).
            num_microbatches: the count when ``micro_batches`` is empty.
            loss_fn: a custom ``(labels, logits, loss_mask) -> loss``; None = Megatron's token mean.
            per_document: pass ``position_ids``/``attention_mask`` to the model.
            step: a train step (``forward_step(data_iterator, model) ->
                (output, loss_func)``, see ``epochal.train.steps``) run for every
                micro-batch instead of ``loss_fn``; its logged values of the step
                are then in :attr:`logged` (see :meth:`reduce_logged`).
            micro_batch_seeds: with ``layout_invariant``, the dropout seed of each
                of this rank's micro-batches
                (:func:`~epochal.parallel.dropout_keys.step_seeds`); None keeps the
                running random stream.

        Returns:
            The step loss (mean of the micro-batch losses over the global batch),
            a detached float32 scalar, the same on every rank.
        """
        n = len(micro_batches) if micro_batches else int(num_microbatches or 0)
        if n < 1:
            raise ValueError("forward_backward needs at least one micro-batch")
        self.logged = []
        invariant = self.layout_invariant
        keyed = invariant and micro_batch_seeds is not None
        with preserved_rng(self.device) if keyed else contextlib.nullcontext():
            if self.dims.pp > 1:
                total = self._pipeline_step(
                    micro_batches, n, loss_fn, per_document, train=True, step=step,
                    seeds=micro_batch_seeds if keyed else None,
                )  # fmt: skip
            else:
                total = torch.zeros((), device=self.device)
                part = self.model_parts[0]
                model = self._step_model(part)
                divisor = n * self.dims.dp if invariant else n  # invariant: the global count
                set_moe_aux_grad_factor(
                    part, self.fp16_scale / divisor
                )  # the balance loss's gradient
                scaled_losses = []
                for i, mb in enumerate(micro_batches):
                    set_gradient_sync(self.model_parts, i == n - 1 and self.reducer is None)
                    if keyed:
                        seed = micro_batch_seeds[i]  # type: ignore[index]
                        seed_micro_batch(context_seed(seed, self.cp_rank), self.device)
                    with self._autocast():
                        if step is not None:
                            loss = self._step_loss(step, mb, model)
                        else:
                            loss = self._plain_loss(model, mb, loss_fn, per_document)
                    scaled = loss / divisor
                    if self.reducer is not None:
                        self.reducer.arm()  # send each unit's gradients once complete
                    (scaled * self.fp16_scale).backward()
                    if self.reducer is not None:
                        self.reducer.after_backward(0)
                    scaled_losses.append(scaled.detach().float())
                    total += scaled_losses[-1]
                if invariant:
                    ordered = gather_in_order(torch.stack(scaled_losses), self.dp_group)
                    self.micro_batch_losses = ordered.tolist()
                    total = sequential_sum(ordered)
        self.finish_grads()
        return total if invariant else self._average_over_dp(total)

    def reduce_logged(self) -> dict[str, float]:
        """The last step's logged values, averaged over micro-batches and data-parallel ranks.

        A collective over the pipeline and data-parallel groups: every rank calls it
        after :meth:`forward_backward` / :meth:`eval_loss` with a ``step``.
        """
        return reduce_logged(
            self.logged,
            pp_group=self.pp_group,
            pp_src=self.dims.pp - 1,
            dp_group=self.dp_group,
            device=self.device,
            ordered=self.layout_invariant,
        )

    def ordered_logged(self) -> list[dict[str, float]]:
        """The last step's logged values of every micro-batch, in global order (a collective)."""
        return ordered_logged(
            self.logged, pp_group=self.pp_group, pp_src=self.dims.pp - 1, dp_group=self.dp_group
        )

    def _average_over_dp(self, total: torch.Tensor) -> torch.Tensor:
        group = self.dp_group
        if group is not None:
            dist.all_reduce(total, group=group)
            total = total / self.dims.dp
        return total

    def finish_grads(self) -> None:
        """Sum tied-embedding gradients over the pipeline ends and reduce partial DTensor gradients."""
        if self.ep is not None:
            self.ep.finish_grads()
        if self.layout_invariant:
            if self.reducer is not None:
                self.reducer.finish()
            if self.dims.dp == 1:
                finalize_partial_grads(self.model_parts)
            if self.cp is not None:  # the ordered per-rank sums, then summed over the chunks
                self.cp.reduce_grads(self.parameters())
            return
        if self.dims.dp == 1:
            finalize_grads(self.model_parts)
        if self.cp is not None:  # after the data-parallel averaging: a sum over the chunks
            self.cp.reduce_grads(self.parameters())
        if self.tied:
            tied = []
            if self.has_first_stage:
                tied.append(self.model_parts[self.stage_ids.index(0)].tok_embeddings.weight)
            if self.has_last_stage:
                tied.append(
                    self.model_parts[self.stage_ids.index(self.dims.num_stages - 1)].output.weight
                )
            self.embedding_group.all_reduce_grads(tied)

    @torch.no_grad()
    def eval_loss(
        self,
        micro_batches: Sequence[dict[str, torch.Tensor]],
        *,
        num_microbatches: int | None = None,
        loss_fn: LossFn | None = None,
        per_document: bool = False,
        step: Any = None,
        on_logits: LogitsObserver | None = None,
    ) -> torch.Tensor:
        """Mean loss of one global batch without gradients (same on every rank); see :meth:`forward_backward`.

        Args:
            on_logits: with a ``step``, called on the ranks holding the last stage
                with each micro-batch and its whole logits ``[b, s, V]`` (padded
                vocabulary), in micro-batch order; a dict it returns is logged with
                the step's values (see :meth:`reduce_logged`).

        Raises:
            ValueError: ``on_logits`` without a ``step``.
        """
        n = len(micro_batches) if micro_batches else int(num_microbatches or 0)
        if on_logits is not None and step is None:
            raise ValueError("eval_loss: on_logits needs a train step (step=...)")
        self.logged = []
        if self.dims.pp > 1:
            total = self._pipeline_step(
                micro_batches, n, loss_fn, per_document, train=False, step=step, on_logits=on_logits
            )
        else:
            total = torch.zeros((), device=self.device)
            part = self.model_parts[0]
            model = self._step_model(part)
            losses = []
            for mb in micro_batches:
                with self._autocast():
                    if step is not None:
                        loss = self._step_loss(step, mb, model, on_logits)
                    else:
                        loss = self._plain_loss(model, mb, loss_fn, per_document)
                    losses.append(loss.float())
                    total += loss.float() / n
            if self.layout_invariant:
                ordered = gather_in_order(torch.stack(losses), self.dp_group)
                self.micro_batch_losses = ordered.tolist()
                return sequential_sum(ordered) / len(ordered)
        return total if self.layout_invariant else self._average_over_dp(total)

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
            return [self.model_parts[self.stage_ids.index(self.dims.num_stages - 1)].output.weight]
        return []

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip all gradients to the global L2 norm ``max_norm`` (0 = measure only); return the norm."""
        if self.ep is not None:
            return self.ep.clip_grad_norm(self, max_norm)
        if self.layout_invariant:
            return clip_grad_norm_exact(
                self.parameters(),
                max_norm,
                group=dist.group.WORLD if self.mesh is not None else None,
                exclude=self.duplicated_parameters(),
                coords={"dp": self.dp_rank, "cp": self.cp_rank, "tp": self.tp_rank},
            )
        return clip_grad_norm_parallel(
            self.parameters(),
            max_norm,
            pp_group=self.pp_group,
            exclude_from_norm=self.duplicated_parameters(),
        )
