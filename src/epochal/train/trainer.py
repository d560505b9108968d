"""The trainer: Megatron's batch math and loss, AdamW, LR schedule, evaluation, exact resumption.

Structure (torchtitan-like: parallelism is added by overriding a few methods, not the loop):

- :meth:`Trainer.build_model_parts` -> a list of ``nn.Module`` (one model of ``model.type`` here;
  pipeline stages later), then :meth:`Trainer.parallelize` (the seam where tensor /
  sequence / data parallelism, recompute and ``torch.compile`` are applied; here
  activation recompute and per-block compile);
- :meth:`Trainer.forward_backward` runs the forward and backward passes of one global
  batch (here: :meth:`Trainer.forward_backward_step` per micro-batch; a pipeline
  schedule under parallelism), then :meth:`Trainer.optimizer_step` clips and steps;
  :meth:`Trainer.train_step` is the two together;
- :class:`~epochal.train.optim.optimizer.OptimizersContainer` and
  :class:`~epochal.train.optim.lr_schedule.OptimizerParamScheduler`;
- the parts it holds: a checkpointer
  (:class:`~epochal.train.state.run_checkpointer.RunCheckpointer`: save, resume,
  initialise from a checkpoint, with DCP ``Stateful`` objects), an evaluator
  (:class:`~epochal.train.observe.evaluator.Evaluator`: when to evaluate, the
  evaluation callbacks) and the dropout keys
  (:class:`~epochal.train.state.dropout_seed.DropoutKeys`);
- a stateful data loader (:class:`epochal.data.WrappedDataLoader`) whose
  ``consumed_samples`` is the data's only resume state.

Every micro-batch goes through a train step (:mod:`epochal.train.steps`:
``forward_step(data_iterator, model) -> (output, loss_func)``, ``loss_func(output)
-> (loss, {"name": value})``), chosen by ``model.type`` (or ``training.train_step``).
Loss (Megatron's default, ``calculate_per_token_loss=False``): each micro-batch's loss
(GPT: the mean over its tokens weighted by ``loss_mask``, ``sum(ce * loss_mask) /
sum(loss_mask)``) is divided by the number of micro-batches and back-propagated (with
a mixture of experts' balance losses, :mod:`epochal.model.layers.moe`); the step's
reported loss is the sum of these, i.e. the mean of the micro-batch means. The step's
logged values are averaged over micro-batches and logged by name. With
the exact synchronisation (:mod:`epochal.train.state.dropout_seed`,
:mod:`epochal.parallel.exact_norm`) the parallel trainer reproduces all of this bit for
bit under any data-parallel size and accumulation. A custom ``loss_fn(labels, logits,
loss_mask) -> scalar`` replaces the GPT per-micro-batch loss (``labels`` are the target
ids ``[b, s]``, ``logits`` ``[b, s, padded_vocab]``, ``loss_mask`` float ``[b, s]``); the
trainer still divides by the number of micro-batches. Fine-tuning rows (``sft.train_file``):
the global batch's token mean instead (:mod:`epochal.train.steps.sft`).

Exact resumption: a checkpoint holds the model, optimizer (FQN-keyed), scheduler step,
``consumed_samples`` and every RNG state; data loaders get their own generators, so
creating iterators never draws from the global RNG. Resuming from any checkpoint on the
same machine type reproduces the uninterrupted run's loss at every later step bit for
bit on CPU (same thread count; on GPU only with deterministic kernels).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from epochal.data.loading.packing import pack_padded_batch
from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.model.layers.moe import set_moe_aux_grad_factor, update_expert_bias
from epochal.parallel.canonical_plan import canonical_refusal, install_canonical
from epochal.parallel.canonical_step_sum import (
    begin_step_sums,
    finish_step_sums,
    step_sums_order,
)
from epochal.parallel.dropout_keys import install_keyed_dropout, seed_micro_batch
from epochal.parallel.engine import compile_part
from epochal.parallel.logged import reduce_logged
from epochal.parallel.recompute import recompute_part
from epochal.parallel.step_model import LogitsObserver, StepModel, run_train_step
from epochal.parallel.step_plan import StepPlan
from epochal.parallel.token_loss import token_cross_entropy
from epochal.train.config import (
    TrainConfig,
    model_config_from_section,
    position_length,
)
from epochal.train.device import compute_context, resolve_device
from epochal.train.inputs.device_batch import batch_on_device
from epochal.train.inputs.loaders import DataBundle, build_data
from epochal.train.inputs.recorded_tokenizer import check_model_vocab, with_resolved_tokenizer
from epochal.train.losses import masked_token_mean_loss
from epochal.train.observe.evaluator import Evaluator
from epochal.train.observe.run_recorder import RunRecorder, open_run_records
from epochal.train.observe.throughput import ThroughputMeter
from epochal.train.optim.loss_scaler import build_loss_scaler, unscale_gradients
from epochal.train.optim.lr_schedule import OptimizerParamScheduler, scheduler_from_config
from epochal.train.optim.optimizer import OptimizersContainer, adamw_from_config, clip_grad_norm
from epochal.train.result import TrainResult
from epochal.train.run_checks import check_device_options, check_state_memory
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.dropout_seed import DropoutKeys
from epochal.train.state.preemption import Preemption
from epochal.train.state.rng import seed_everything
from epochal.train.state.run_checkpointer import Progress, RunCheckpointer, find_checkpoint
from epochal.train.state.run_dir import check_run_dir_place
from epochal.train.state.run_lock import hold_run_dir
from epochal.train.steps import (
    LossFnStep,
    SFTTrainStep,
    TrainStep,
    load_eval_callback,
    load_train_step,
    train_step_class,
)

__all__ = ["LossFn", "TrainResult", "Trainer", "masked_token_mean_loss", "resolve_device"]

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
StepCallback = Callable[["Trainer", int, dict[str, Any]], None]


class Trainer:
    """Single-process GPT trainer (CPU or one GPU); see the module docstring.

    Args:
        config: the resolved configuration.
        loss_fn: optional custom per-micro-batch loss (see the module docstring).
        data: prebuilt data (tests, notebooks); default :func:`epochal.train.inputs.loaders.build_data`.
        log: print progress (tqdm) and messages.

    Attributes:
        checkpointer: saves, resumes and initialises the run
            (:class:`~epochal.train.state.run_checkpointer.RunCheckpointer`).
        evaluator: when to evaluate, the evaluation callbacks, the last evaluation's
            values (:class:`~epochal.train.observe.evaluator.Evaluator`).
        exact: the exact gradient synchronisation (``training.layout_invariant``: keyed
            dropout, the exact gradient norm), read once here.
        dropout_keys: each micro-batch's dropout seed under :attr:`exact`
            (:class:`~epochal.train.state.dropout_seed.DropoutKeys`).
        step / tokens_seen / eval_history: the run's counters (what a checkpoint keeps).

    Raises:
        ConfigError: an option that only turns out invalid with the data (e.g.
            ``model.vocab_size`` smaller than the tokenizer's).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        loss_fn: LossFn | None = None,
        data: DataBundle | None = None,
        log: bool = True,
    ) -> None:
        config = with_resolved_tokenizer(config)  # the saved config names the tokenizer used
        self.config = config
        self.log = log
        t = config.training
        self.preemption = Preemption(
            exit_signal_handler=t.exit_signal_handler,
            exit_duration_mins=t.exit_duration_mins,
            exit_interval=t.exit_interval,
            any_rank=self.max_over_ranks,
        )
        self.exact = t.layout_invariant
        seed_everything(self.global_seed())
        self.run_dir = Path(config.run_dir)
        self.device = resolve_device(t.device, deterministic=t.deterministic_kernels)
        check_device_options(config, self.device)  # before the data writes anything
        self.train_step_handler: TrainStep = self.build_train_step()
        if loss_fn is not None:
            self.loss_fn = loss_fn
        self.logged: list[dict[str, Any]] = []
        self.callbacks: list[StepCallback] = []
        self.evaluator = Evaluator(
            self.validation_pass,
            training=t,
            callbacks=[load_eval_callback(t.eval_callback)] if t.eval_callback else [],
        )
        self.data = data if data is not None else build_data(config, **self.data_parallel_info())
        check_model_vocab(config, self.data.vocab_size)
        self.model_config: ModelConfig = model_config_from_section(
            config.model, vocab_size=self.data.vocab_size, seq_length=position_length(config)
        )
        check_state_memory(config, self.model_config, self.device)
        #: the invariance degree the model computes in (0: no canonical units)
        self.canonical_degree = self.choose_canonical_degree()
        self.model_parts = self.parallelize(self.build_model_parts())
        self.optimizers = self.build_optimizers()
        self.loss_scaler = build_loss_scaler(t, self.device)
        self.scheduler = self.build_scheduler()
        self.checkpointer = RunCheckpointer(
            self.checkpoint_store(),
            config=config,
            model_config=self.model_config,
            model_parts=self.model_parts,
            optimizer_state=self.optimizer_state(),
            scheduler=self.scheduler,
            data=self.data,
            loss_scaler=self.loss_scaler,
            log=self.log,
            rank=self.rank,
        )
        self.dropout_keys = DropoutKeys(
            seed=t.seed,
            device=self.device,
            model_parts=self.model_parts,
            keyed=self.exact,
            **self.data_parallel_info(),
        )
        self.step = 0
        self.tokens_seen = 0
        self.eval_history: list[tuple[int, float]] = []

    # ---------------------------------------------------------------- the seams
    def build_train_step(self) -> TrainStep:
        """The train step: ``training.train_step`` if set, else the one registered for ``model.type``.

        Raises:
            ConfigError: an unknown model type, or a bad ``training.train_step`` (import, class).
        """
        t = self.config.training
        spec = getattr(t, "train_step", "")
        kwargs = dict(getattr(t, "train_step_kwargs", {}) or {})
        m = self.config.model  # a fine-tuning head (model.head) has its own step
        if spec:
            cls = load_train_step(spec)
        else:  # fine-tuning rows (sft.train_file): a global token mean
            cls = SFTTrainStep if self.config.sft.enabled else train_step_class(m.type, m.head)
        return cls(self.config, **kwargs)

    @property
    def loss_fn(self) -> LossFn | None:
        """The custom ``(labels, logits, loss_mask) -> loss`` in use, or None (the step's own loss)."""
        h = self.train_step_handler
        return h.custom_loss if isinstance(h, LossFnStep) else None

    @loss_fn.setter
    def loss_fn(self, fn: LossFn) -> None:
        self.train_step_handler = LossFnStep(fn, self.config)

    @property
    def rank(self) -> int:
        """Global rank (0 in a single process)."""
        return 0

    def global_seed(self) -> int:
        """The seed of this rank's global RNGs (dropout): ``training.seed`` here."""
        return self.config.training.seed

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` over all ranks (one process: ``value``)."""
        return value

    def data_parallel_info(self) -> dict[str, int]:
        """``{"dp_rank": ..., "dp_size": ...}`` for building the data (one process: 0 of 1)."""
        return {"dp_rank": 0, "dp_size": 1}

    def build_model_parts(self) -> list[nn.Module]:
        """Build the model as a list of parts (one here), initialized on ``self.device``."""
        with torch.device(self.device):
            model = build_model(self.model_config, seed=self.config.training.seed)
        return [model]

    def choose_canonical_degree(self) -> int:
        """``parallel.invariant_degree`` when the model computes in canonical units, else 0.

        The units hold under ``training.layout_invariant`` for the models and layouts
        :func:`~epochal.parallel.canonical_plan.canonical_refusal` accepts; otherwise
        the run keeps the data-parallel rule and says why (once, on rank 0).
        """
        pc = self.config.parallel
        if not self.exact or pc.invariant_degree <= 1:
            return 0
        reason = canonical_refusal(
            self.model_config,
            pc.invariant_degree,
            tp=pc.tensor_parallel,
            cp=pc.context_parallel,
            seq_length=self.config.data.seq_length,
            sequence_parallel=pc.sequence_parallel,
            context_degree=pc.invariant_context_degree,
            packed=self.config.data.pack_sequences,
            decoder_seq_length=(
                self.config.data.seq_length_decoder if self.model_config.type == "t5" else None
            ),
        )
        if reason is None:
            return pc.invariant_degree
        if self.log and self.rank == 0:
            print(f"layout invariance holds across data-parallel layouts only: {reason}")
        return 0

    def parallelize(self, model_parts: list[nn.Module]) -> list[nn.Module]:
        """Canonical units (:meth:`choose_canonical_degree`), recompute, ``torch.compile`` if asked."""
        pc = self.config.parallel
        for part in model_parts:
            if self.canonical_degree:
                install_canonical(
                    part,
                    self.canonical_degree,
                    context_degree=pc.invariant_context_degree,
                    step_sums=step_sums_order(pc, cp=1, compile=self.config.training.compile),
                )
            unit_keys = recompute_part(part, pc)
            if self.config.training.compile:
                compile_part(part, unit_keys, tensor_parallel=False)
            if self.exact:
                install_keyed_dropout(part)
        return model_parts

    def build_optimizers(self) -> OptimizersContainer:
        """AdamW per model part with Megatron's parameter groups (``optimizer.*``)."""
        return adamw_from_config(self.model_parts, self.config)

    def build_scheduler(self) -> OptimizerParamScheduler:
        """Megatron's LR/WD scheduler, counting optimizer steps."""
        return scheduler_from_config(self.optimizers, self.config)

    def checkpoint_store(self) -> Checkpointer:
        """Where the checkpoints are written: ``run_dir/checkpoints`` (``checkpoint.keep_last``)."""
        keep = self.config.checkpoint.keep_last
        return Checkpointer(self.run_dir / "checkpoints", keep_last=keep, rank=self.rank)

    def optimizer_state(self) -> Any:
        """The optimizers as the DCP ``Stateful`` a checkpoint saves (FQN-keyed)."""
        return self.optimizers

    def clip_gradients(self, max_norm: float | None = None) -> torch.Tensor:
        """Clip to ``max_norm`` (default ``optimizer.clip_grad``; 0 = measure only) as a global
        L2 norm; return the norm before clipping."""
        clip = self.config.optimizer.clip_grad if max_norm is None else max_norm
        return clip_grad_norm(
            self.gradient_parameters(), clip, self.exact, pieces=self.canonical_degree or 1
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 / fp16 autocast (``training.bf16`` / ``fp16``) and ``training.attention_backend``."""
        t = self.config.training
        return compute_context(
            self.device, bf16=t.bf16, fp16=t.fp16, attention_backend=t.attention_backend
        )

    def grad_scale(self) -> float:
        """The fp16 loss scaler's scale: what the loss is multiplied by before the backward (else 1)."""
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def gradient_parameters(self) -> list[torch.Tensor]:
        """This rank's parameters whose gradients the optimizer uses."""
        return list(self.optimizers.parameters())

    def throughput_meter(self) -> ThroughputMeter:
        """Tokens/s, MFU and memory of the train records (:mod:`epochal.train.observe.throughput`)."""
        return ThroughputMeter.from_config(
            self.config, self.model_config, self.device, num_devices=self.num_devices()
        )

    def num_devices(self) -> int:
        """Devices sharing the step's tokens (MFU is per device): 1 in one process."""
        return 1

    def add_callback(self, fn: StepCallback) -> None:
        """Call ``fn(trainer, step, metrics)`` after every optimizer step (after eval/save)."""
        self.callbacks.append(fn)

    def add_eval_callback(self, fn: LogitsObserver) -> None:
        """Call ``fn(batch, logits)`` for every validation micro-batch (after ``training.eval_callback``).

        See :meth:`~epochal.train.observe.evaluator.Evaluator.add_callback`: ``logits``
        ``[b, s, V]`` (padded vocabulary) on the ranks holding the last pipeline stage;
        a ``{name: number}`` it returns is logged with the evaluation.
        """
        self.evaluator.add_callback(fn)

    @property
    def last_eval_logged(self) -> dict[str, float]:
        """The last evaluation's logged values by name (averaged over micro-batches and ranks)."""
        return self.evaluator.last_logged

    # ------------------------------------------------------------ checkpoints
    def progress(self) -> Progress:
        """The counters a checkpoint keeps: ``step``, ``tokens_seen``, ``eval_history``."""
        return Progress(self.step, self.tokens_seen, self.eval_history)

    def app_state(self) -> dict[str, Any]:
        """The DCP state: model parts and optimizers (``Stateful``)."""
        return self.checkpointer.app_state()

    def save_checkpoint(self) -> Path:
        """Save the current step; returns the step folder (:meth:`RunCheckpointer.save`)."""
        return self.checkpointer.save(self.progress())

    def load_checkpoint(self, folder: str | Path) -> None:
        """Restore everything from ``folder`` (:meth:`RunCheckpointer.load`), counters included."""
        self._set_progress(self.checkpointer.load(folder))

    def init_from_checkpoint(self, folder: str | Path) -> None:
        """Load only the model weights of ``folder`` (:meth:`RunCheckpointer.init_from`)."""
        self.checkpointer.init_from(folder)

    find_checkpoint = staticmethod(find_checkpoint)

    def _set_progress(self, progress: Progress | None) -> None:
        if progress is not None:
            self.step, self.tokens_seen = progress.step, progress.tokens_seen
            self.eval_history = progress.eval_history

    def resume_or_init(self) -> Path | None:
        """Resume per ``checkpoint.resume`` or, starting fresh, load the weights of
        ``checkpoint.init_from``; returns the folder resumed from (None: a fresh start)."""
        folder = self.checkpointer.resume_folder()
        if folder is not None:
            self._set_progress(self.checkpointer.resume(folder))
        elif self.config.checkpoint.init_from:
            self.init_from_checkpoint(
                find_checkpoint(self.config.checkpoint.init_from, "init_from")
            )
        return folder

    # ------------------------------------------------------------ computation
    def step_model(self) -> StepModel:
        """The model as a train step sees it (``labels=`` gives per-token losses)."""
        part, t = self.model_parts[0], self.config.training
        ce = token_cross_entropy(
            chunk_tokens=t.loss_chunk_tokens, compiled=t.compile and t.compile_loss
        )
        return StepModel(
            part, module=part, cross_entropy=ce, canonical_degree=self.canonical_degree
        )

    def step_batch(self, micro_batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """A micro-batch on the device as the train step gets it.

        ``position_ids`` / ``attention_mask`` are dropped unless the data resets them per
        document (``data.reset_position_ids`` / ``reset_attention_mask``) or row (``sft.packing``).
        With ``data.pack_sequences`` the samples are packed into one row first
        (:func:`~epochal.data.loading.packing.pack_padded_batch`) whose length is a
        multiple of :meth:`~epochal.parallel.config.ParallelConfig.packed_row_multiple`.
        """
        if self.config.data.pack_sequences:
            micro_batch = pack_padded_batch(
                micro_batch,
                pad_to_multiple_of=self.config.parallel.packed_row_multiple(
                    canonical=bool(self.canonical_degree)
                ),
                per_sample_keys=self.train_step_handler.per_sample_keys,
            )
        out = batch_on_device(micro_batch, self.device)
        if not self.config.per_document_positions:
            out.pop("position_ids", None)
        if not self.config.per_document_attention:
            out.pop("attention_mask", None)
        return out

    def run_step(
        self,
        micro_batch: dict[str, torch.Tensor],
        plan: StepPlan,
        on_logits: LogitsObserver | None = None,
    ) -> torch.Tensor:
        """One micro-batch (on the device) through the train step: its loss as ``plan`` makes it
        (not yet divided); logged values kept.

        ``on_logits(micro_batch, logits)`` (evaluation callbacks) sees the logits
        of the step's model call; what it returns is logged with the step's values.
        """
        loss, logged = run_train_step(
            self.train_step_handler, micro_batch, self.step_model(), plan, on_logits
        )
        self.logged.append(logged)
        return loss

    def forward_backward_step(
        self, micro_batch: dict[str, Any], plan: StepPlan, index: int
    ) -> torch.Tensor:
        """Forward and backward of micro-batch ``index`` of the step; returns its detached share
        of the step loss (``loss / plan.divisor``)."""
        mb = self.step_batch(micro_batch)
        if plan.seeds is not None:
            seed_micro_batch(plan.seeds[index], self.device)
        with self.autocast():
            loss = self.run_step(mb, plan)
        scaled = plan.divided(loss)
        (scaled * plan.loss_scale).backward()
        return scaled.detach()

    def reduce_logged(self) -> dict[str, float]:
        """The logged values of the last step / evaluation batch, averaged over micro-batches."""
        return reduce_logged(self.logged)

    def num_microbatches(self) -> int:
        """Micro-batches of the next step (Megatron: gbs / (mbs * dp), ramp-up aware)."""
        return self.data.num_microbatches_at(self.data.train_loader.consumed_samples)

    def train_step(self, batches: Iterator[dict[str, Any]]) -> dict[str, Any]:
        """One optimizer step over one global batch pulled from ``batches``.

        Returns:
            ``{"loss", "grad_norm", "lr", "skipped"}`` and the train step's logged
            values by name (Python numbers).
        """
        loss, logged = self.compute_gradients(batches)
        return {**self.optimizer_step(loss), **logged}

    def compute_gradients(
        self, batches: Iterator[dict[str, Any]], *, loss_tokens: float | None = None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The first half of :meth:`train_step`: cleared gradients, then the forward and
        backward of one global batch; returns the detached loss and the logged values
        (:meth:`optimizer_step` completes the step).

        Args:
            batches: the micro-batches of this rank.
            loss_tokens: the global batch's loss tokens for a global token mean
                (``num_items_in_batch``); None: the train step's own choice
                (:meth:`global_loss_tokens`).
        """
        n_mb = self.num_microbatches()
        for part in self.model_parts:
            part.train()
        self.optimizers.zero_grad(set_to_none=True)
        self.logged = []
        if loss_tokens is None:
            loss_tokens = self.global_loss_tokens(n_mb)
        with self.dropout_keys.step(self.step, n_mb) as seeds:
            plan = self.step_plan(n_mb, seeds=seeds, loss_tokens=loss_tokens)
            loss = self.forward_backward(batches, plan)
        return loss, self.reduce_logged()

    def global_loss_tokens(self, num_microbatches: int) -> int | None:
        """The loss tokens of the next global batch when the train step trains on their mean
        (:attr:`~epochal.train.steps.TrainStep.calculate_per_token_loss` and data that counts
        them: no communication, every rank knows every sample's count), else None."""
        counter = getattr(self.data, "loss_tokens", None)
        if counter is None or not self.train_step_handler.calculate_per_token_loss:
            return None
        dp = self.data_parallel_info()["dp_size"]
        samples = num_microbatches * self.config.training.micro_batch_size * dp
        return counter(self.data.train_loader.consumed_samples, samples)

    def step_plan(
        self,
        num_microbatches: int,
        *,
        seeds: Sequence[int] | None = None,
        loss_tokens: float | None = None,
    ) -> StepPlan:
        """The step plan (:mod:`epochal.parallel.step_plan`): each micro-batch loss divided by
        :meth:`loss_divisor`, the fp16 scale, the dropout seeds, a global token count."""
        return StepPlan.training_step(
            num_microbatches,
            divisor=self.loss_divisor(num_microbatches),
            loss_scale=self.grad_scale(),
            global_micro_batches=num_microbatches * self.data_parallel_info()["dp_size"],
            loss_tokens=loss_tokens,
            seeds=seeds,
        )

    def loss_divisor(self, num_microbatches: int) -> int:
        """What each micro-batch loss is divided by: the step's micro-batches (one process)."""
        return num_microbatches

    def forward_backward(self, batches: Iterator[dict[str, Any]], plan: StepPlan) -> torch.Tensor:
        """Forward and backward of one global batch as ``plan`` says; returns the step's detached loss.

        Raises:
            StopIteration: ``batches`` ran out.
        """
        set_moe_aux_grad_factor(self.model_parts, plan.aux_grad_factor)  # MoE balance losses
        begin_step_sums(self.model_parts)
        total = torch.zeros((), device=self.device)
        for i in range(plan.num_microbatches):
            total += self.forward_backward_step(next(batches), plan, i)
        finish_step_sums(self.model_parts)  # canonical units' weight trees, once per step
        return total

    def sum_expert_counts(self, counts: torch.Tensor) -> None:
        """Sum MoE experts' step counts (``[layers, E]``, in place) over the ranks holding
        other tokens of the step's layers: nothing to do on one process."""

    def optimizer_step(self, loss: torch.Tensor, max_norm: float | None = None) -> dict[str, Any]:
        """Unscale (fp16), clip (to ``max_norm``, default ``optimizer.clip_grad``), and step
        the optimizers and the schedule.

        A non-finite gradient norm (an fp16 overflow, or a NaN) skips the step as in
        Megatron: neither the optimizers nor the learning-rate schedule step, and
        the fp16 loss scaler lowers its scale (after ``training.hysteresis`` such steps).

        Returns:
            ``{"loss", "grad_norm", "lr", "skipped"}`` (Python numbers), and
            ``"loss_scale"`` (the scale after this step's update) under fp16.
        """
        if self.loss_scaler is not None:
            unscale_gradients(self.gradient_parameters(), self.loss_scaler.scale)
        grad_norm = self.clip_gradients(max_norm)
        lr = self.optimizers.param_groups[0]["lr"]
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizers.step()
            self.scheduler.step(1)
        # MoE's auxiliary-loss-free balancing bias moves with the weights (kept on a skip)
        update_expert_bias(self.model_parts, self.sum_expert_counts, apply=finite)
        out = {
            "loss": float(loss.item()),
            "grad_norm": float(grad_norm.item()),
            "lr": float(lr),
            "skipped": 0 if finite else 1,
        }
        if self.loss_scaler is not None:
            self.loss_scaler.update(not finite)
            out["loss_scale"] = self.loss_scaler.scale
        return out

    @torch.no_grad()
    def evaluate(self, on_logits: LogitsObserver | None = None) -> float | None:
        """Validation loss: mean of the micro-batch losses over ``eval_iters`` global batches.

        A fine-tuning table (``data.whole_validation``) is read whole, and the train
        step may replace the mean by an exact loss
        (:meth:`~epochal.train.steps.TrainStep.evaluation_loss`).

        Every evaluation reads the validation data from its start (the same
        samples every time). The train step's logged values, averaged the same
        way (plus its :meth:`~epochal.train.steps.TrainStep.eval_summary`), are
        left in :attr:`last_eval_logged`, with what the evaluation callbacks
        (:meth:`add_eval_callback`) and ``on_logits`` return. Returns None if there
        is no validation data.
        """
        return self.evaluator.evaluate(self.train_step_handler, on_logits)

    @torch.no_grad()
    def evaluate_logits(self) -> list[torch.Tensor] | None:
        """Run an evaluation and return its logits (Accelerate's ``return_logits``).

        Returns:
            this rank's validation micro-batches' logits, one float32 CPU tensor
            ``[micro_batch_size, s, V]`` per micro-batch in order, on ranks holding
            the last pipeline stage (None on the others). Under data parallelism
            each rank has its own samples: ``torch.cat([gather_across_data_parallel_groups(x)
            for x in logits])`` puts them in the order of a single-process run.
            The evaluation's loss and logged values are kept as by :meth:`evaluate`.
        """
        kept: list[torch.Tensor] = []
        self.evaluate(on_logits=lambda batch, logits: kept.append(logits.float().cpu()))
        return kept if self.holds_last_stage() else None

    def holds_last_stage(self) -> bool:
        """Whether this rank computes the model's output (always, in one process)."""
        return True

    def validation_pass(
        self, observer: LogitsObserver | None
    ) -> tuple[float | None, list[dict[str, Any]]] | None:
        """The forward passes of an evaluation (:data:`~epochal.train.observe.evaluator.ValidationPass`).

        Returns:
            The mean of the micro-batch losses (None if there was no micro-batch) and
            the micro-batches' logged values; None without validation data or with
            ``eval_iters=0``.
        """
        loader = self.data.valid_loader
        iters = self.config.training.eval_iters
        if loader is None or iters == 0:
            return None
        for part in self.model_parts:
            part.eval()
        n_mb = self.num_microbatches()
        total, count = 0.0, 0
        self.logged = []
        limit = len(loader) if self.data.whole_validation else iters * n_mb
        plan = StepPlan.evaluation(n_mb)
        for i, mb in enumerate(loader):
            if i >= limit:
                break
            batch = self.step_batch(mb)
            with self.autocast():
                total += float(self.run_step(batch, plan, observer).item())
            count += 1
        for part in self.model_parts:
            part.train()
        return (total / count if count else None), self.logged

    # ------------------------------------------------------------------ loop
    def train(self) -> TrainResult:
        """Train until ``training.train_iters`` (resuming first per ``checkpoint.resume``).

        Stops earlier, after saving a checkpoint of the step reached, on SIGTERM/SIGINT
        or the ``training.exit_*`` options (:mod:`epochal.train.state.preemption`); then
        :attr:`TrainResult.stopped_by` says why and :attr:`TrainResult.last_checkpoint`
        where it saved (nothing is printed here: ``epochal train``'s summary says it).

        Raises:
            RunDirLocked: another live process trains in ``run_dir``
                (:mod:`epochal.train.state.run_lock`).
            ConfigError: ``run_dir`` is a file or lies inside a checkpoint, a checkpoints
                folder or a converted model (:func:`check_run_dir_place`).
        """
        check_run_dir_place(self.run_dir, strict=False)  # not a file, nor in a checkpoint
        lock = hold_run_dir(
            self.run_dir, rank=self.rank, any_rank=self.max_over_ranks, log=self.log
        )
        with lock, self.preemption.installed():
            return self._train()

    def _train(self) -> TrainResult:
        started = time.perf_counter()
        folder = self.resume_or_init()
        rec = self.open_records(folder)
        batches = self.data.train_loader.stream()
        total = self.config.training.train_iters
        try:
            while self.step < total:
                out = self.timed_step(batches, rec)
                if out is None:
                    break
                record = rec.record(self.step, out, self.tokens_seen)
                last = self.step == total
                self.evaluate_if_due(last, rec)
                saved = self.save_if_due(last, rec.result)
                for fn in self.callbacks:
                    fn(self, self.step, record)
                if not last and self.stop_if_asked(saved, rec.result):
                    break
        finally:
            rec.close(self.step)
        return rec.finish(self.step, started)

    def open_records(self, folder: Path | None) -> RunRecorder:
        """Start this call's records (:func:`~epochal.train.observe.run_recorder.open_run_records`)."""
        return open_run_records(
            self.config,
            self.run_dir,
            resumed_from=folder,
            start_step=self.step,
            eval_history=self.eval_history,
            sample_check=self.checkpointer.sample_check,
            loader=self.data.train_loader,
            meter=self.throughput_meter(),
            device=self.device,
            rank=self.rank,
            log=self.log,
        )

    def timed_step(
        self, batches: Iterator[dict[str, Any]], rec: RunRecorder
    ) -> dict[str, Any] | None:
        """One optimizer step (:meth:`train_step`), timed by ``rec``; None when the data ran out."""
        rec.start_step(self.step + 1)
        try:
            out = self.train_step(batches)
        except StopIteration:
            rec.metrics.write_line(f"training data exhausted at step {self.step}")
            return None
        self.step += 1
        self.tokens_seen += rec.end_step(self.step)
        return out

    def evaluate_if_due(self, last: bool, rec: RunRecorder) -> None:
        """Evaluate when :meth:`Evaluator.due`, and record the loss (history, result, metrics)."""
        if not self.evaluator.due(self.step, last):
            return
        loss = self.evaluate()
        if loss is not None:
            self.eval_history.append((self.step, loss))
            ppl = self.train_step_handler.perplexity(loss, self.last_eval_logged)
            rec.result.eval_loss, rec.result.eval_ppl = loss, ppl
            rec.metrics.log_eval(self.step, loss, self.last_eval_logged, ppl=ppl)

    def save_if_due(self, last: bool, result: TrainResult) -> bool:
        """Save a checkpoint when :meth:`RunCheckpointer.due`; whether it saved."""
        if not self.checkpointer.due(self.step, last):
            return False
        result.last_checkpoint = self.save_checkpoint()
        return True

    def stop_if_asked(self, saved: bool, result: TrainResult) -> bool:
        """Whether to stop early (a signal, ``training.exit_*``): then save the step if not
        ``saved`` and say why in ``result.stopped_by``."""
        reason = self.preemption.should_stop(self.step)
        if reason is None:
            return False
        if not saved:
            result.last_checkpoint = self.save_checkpoint()
        # reported once, by the caller's summary (`epochal train`: "stopped early")
        result.stopped_by = self.preemption.describe(reason)
        return True
