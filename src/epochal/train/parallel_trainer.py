"""``ParallelTrainer``: the trainer under tensor, sequence, pipeline and data parallelism.

It is :class:`~epochal.train.trainer.Trainer` with its seams overridden
(the loop, logging, checkpoints and resumption are the base class's):

- the process group and the ``(pp, dp, cp, tp)`` device mesh come from
  :mod:`epochal.parallel.launch` / :class:`~epochal.parallel.dims.ParallelDims`
  (``[parallel]`` section; the data-parallel size is the world size divided by
  ``tensor_parallel * context_parallel * pipeline_parallel``);
- the data is built for this rank's data-parallel slice (rank 0 prepares any
  shared cache first); tensor-parallel and pipeline ranks of one data-parallel
  rank read the same micro-batches (deterministic data, no broadcast), and
  middle pipeline ranks read none: they only advance ``consumed_samples``;
- the model parts come from :class:`~epochal.parallel.engine.ParallelEngine`
  (pipeline split, TP/SP, recompute, compile, FSDP2), which also runs the
  step's forward/backward (pipeline schedules included) and the clipping;
- checkpoints are DCP folders saved by every rank together and loadable under
  any other layout (see :mod:`epochal.parallel.checkpoint`);
- only global rank 0 logs and writes metrics.

The step loss, gradient norm and validation loss are global (the same on every
rank). With one process and the default ``[parallel]`` section it computes
exactly what :class:`Trainer` computes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from epochal.model.build import build_model
from epochal.model.config import ModelConfig
from epochal.parallel.checkpoint import TiedOptimizerState, consolidate_checkpoint
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.parallel.launch import DistributedInfo, init_distributed, is_logging_rank, rank0_first
from epochal.parallel.model_support import check_model_layout
from epochal.parallel.rng import pipeline_stage_seed
from epochal.parallel.step_model import LogitsObserver
from epochal.parallel.step_plan import StepPlan
from epochal.train.config import TrainConfig, model_config_from_section, position_length
from epochal.train.device import resolve_device
from epochal.train.inputs.loaders import DataBundle, build_data
from epochal.train.run_checks.kernels import check_process_group_backend
from epochal.train.state.checkpoint import Checkpointer, SafeFileSystemReader, SafeLoadPlanner
from epochal.train.steps import set_data_parallel_group
from epochal.train.trainer import LossFn, Trainer

#: added to the default-stream seed per context-parallel rank (see ``global_seed``)
CONTEXT_PARALLEL_SEED_STRIDE = 1_000_003

__all__ = ["ParallelTrainer", "check_layout", "export_consolidated", "wants_parallel"]


def wants_parallel(config: TrainConfig) -> bool:
    """True if the run needs :class:`ParallelTrainer` (several processes or a non-trivial layout)."""
    p = config.parallel
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (
        world > 1 or p.model_parallel_size > 1 or max(p.launch_data_parallel, p.expert_parallel) > 1
    )


def check_layout(config: TrainConfig, world_size: int) -> ParallelDims:
    """Check ``config.parallel`` against ``world_size``, the model and the batch sizes.

    Needs no process group and no data, so ``epochal train`` runs it before it
    launches any process. The padded vocabulary is checked only when
    ``model.vocab_size`` is set (otherwise the tokenizer decides it, and the
    trainer checks it once the data is built).

    Returns:
        The :class:`~epochal.parallel.dims.ParallelDims` of the layout.

    Raises:
        ConfigError: naming the option that has to change (e.g. ``parallel.tensor_parallel``).
    """
    dims = ParallelDims.from_config(config.parallel, world_size)
    dims.validate(
        model_config_from_section(
            config.model,
            vocab_size=config.model.vocab_size or 1,
            seq_length=position_length(config),
        ),
        micro_batch_size=config.training.micro_batch_size,
        global_batch_size=config.training.global_batch_size,
        seq_length=config.data.seq_length,
        config=config.parallel,
        check_vocab=config.model.vocab_size is not None,
        decoder_seq_length=config.data.seq_length_decoder if config.model.type == "t5" else None,
    )
    return dims


class ParallelTrainer(Trainer):
    """:class:`Trainer` under the layout of ``config.parallel`` (see the module docstring).

    Args:
        config: the resolved configuration.
        loss_fn: optional custom loss ``(labels, logits, loss_mask) -> scalar``; it
            receives logits gathered over the vocabulary.
        data: prebuilt data for THIS rank's data-parallel slice (default: built here).
        log: print progress (rank 0 only).
        dist_info: an existing :class:`~epochal.parallel.launch.DistributedInfo`
            (default: join the process group that ``torchrun`` describes).

    Raises:
        ConfigError: the layout does not fit the world size, the model or the
            batch sizes (the message names the option).
    """

    #: parameter names (canonical) that are not trained (``requires_grad=False``); a
    #: front end sets it before building (``epochal.accelerate``: frozen weights)
    frozen: frozenset[str] = frozenset()

    def __init__(
        self,
        config: TrainConfig,
        *,
        loss_fn: LossFn | None = None,
        data: DataBundle | None = None,
        log: bool = True,
        dist_info: DistributedInfo | None = None,
    ) -> None:
        if dist_info is None:  # nccl on a CPU fails inside init_process_group: say so first
            check_process_group_backend(config, resolve_device(config.training.device))
        self.dist = dist_info or init_distributed(config.parallel, config.training.device)
        # Everything but the tokenizer's vocabulary (checked with the real config later).
        self.dims = check_layout(config, self.dist.world_size)
        self.mesh = self.dims.build_mesh(self.dist.device.type) if self.dist.distributed else None
        self.custom_loss: LossFn | None = loss_fn
        #: the ranks of this pipeline stage, which sum MoE's balancing counts (made here by
        #: every rank, as groups are: a stage without MoE layers never sums any)
        self._stage_group: Any = None
        if self.mesh is not None and config.model.moe_router_enable_expert_bias:
            self._stage_group = (
                dist.group.WORLD
                if self.dims.pp == 1
                else self.mesh[("dp", "cp", "tp")]._flatten().get_group()
            )
        set_data_parallel_group(
            self.mesh["dp"].get_group() if self.mesh is not None and self.dims.dp > 1 else None
        )
        if data is None:
            info = self.data_parallel_info()
            say = print_line if log and is_logging_rank() else None  # corpus / SFT row reports
            data = rank0_first(lambda: build_data(config, log=say, **info))
        super().__init__(config, loss_fn=loss_fn, data=data, log=log and is_logging_rank())

    # ---------------------------------------------------------------- the seams
    @property
    def rank(self) -> int:
        """Global rank."""
        return self.dist.rank

    def global_seed(self) -> int:
        """``training.seed + 100 * pipeline stage`` (Megatron), so stages draw different masks.

        Tensor-parallel regions fork their own per-rank streams from it
        (:mod:`epochal.parallel.rng`). Context-parallel ranks hold different tokens of
        the same samples: each adds ``CONTEXT_PARALLEL_SEED_STRIDE * cp_rank``, so that
        its chunks do not replay rank 0's dropout masks (tensor-parallel ranks of one
        context-parallel rank keep one default stream).
        """
        coords = self.dims.coords(self.dist.rank)
        seed = pipeline_stage_seed(self.config.training.seed, coords["pp"])
        return seed + CONTEXT_PARALLEL_SEED_STRIDE * coords["cp"]

    def data_parallel_info(self) -> dict[str, int]:
        """This rank's data-parallel coordinate and the data-parallel size."""
        return {"dp_rank": self.dims.coords(self.dist.rank)["dp"], "dp_size": self.dims.dp}

    def build_model_parts(self) -> list[nn.Module]:
        """Validate the layout and build this rank's parts with the :class:`ParallelEngine`."""
        c = self.config
        self.device = self.dist.device
        self._validate_layout(c, self.model_config)
        self.engine = ParallelEngine(
            c.parallel,
            self.model_config,
            self.dims,
            self.mesh,
            device=self.device,
            seed=c.training.seed,
            compile=c.training.compile,
            custom_loss=self.custom_loss is not None,
            bf16=c.training.bf16,
            fp16=c.training.fp16,
            exact_sync=self.exact,
            canonical_degree=self.canonical_degree,
            frozen=self.frozen,
        )
        return self.engine.model_parts

    def _validate_layout(self, c: TrainConfig, model_config: ModelConfig) -> None:
        self.dims.validate(
            model_config,
            micro_batch_size=c.training.micro_batch_size,
            global_batch_size=c.training.global_batch_size,
            seq_length=c.data.seq_length,
            config=c.parallel,
            decoder_seq_length=c.data.seq_length_decoder if model_config.type == "t5" else None,
        )
        check_model_layout(
            model_config,
            self.dims,
            sequence_parallel=c.parallel.sequence_parallel,
            canonical=bool(self.canonical_degree),
        )

    def parallelize(self, model_parts: list[nn.Module]) -> list[nn.Module]:
        """Nothing left to do: the engine applied everything while building the parts."""
        return model_parts

    def checkpoint_store(self) -> Checkpointer:
        """``run_dir/checkpoints``, written by every rank together (DCP)."""
        distributed = self.dist.distributed
        return Checkpointer(
            self.run_dir / "checkpoints",
            keep_last=self.config.checkpoint.keep_last,
            rank=self.rank,
            barrier=dist.barrier if distributed else None,
            world_size=self.dist.world_size,
            all_gather=_all_gather if distributed else None,
        )

    def optimizer_state(self) -> Any:
        """The optimizers as a DCP ``Stateful``, reshardable across layouts (a tied head's
        state under the embedding's names on a last stage without the first)."""
        e = self.engine
        return TiedOptimizerState(
            self.optimizers, e.tied and e.has_last_stage and not e.has_first_stage
        )

    def gradient_parameters(self) -> list[torch.Tensor]:
        """This rank's parameters (all model parts, each once)."""
        return self.engine.parameters()

    def clip_gradients(self, max_norm: float | None = None) -> torch.Tensor:
        """Global-norm clipping over all ranks (DTensor-aware, tied copies counted once) to
        ``max_norm`` (default ``optimizer.clip_grad``)."""
        clip = self.config.optimizer.clip_grad if max_norm is None else max_norm
        return self.engine.clip_grad_norm(clip)

    def num_parameters(self) -> int:
        """Parameters of the whole model (all ranks together; tied weights once)."""
        with torch.device("meta"):
            return build_model(self.model_config).num_parameters()

    def _per_document(self) -> bool:
        c = self.config
        return c.per_document_positions or c.per_document_attention

    def _every_stage_reads(self) -> bool:
        return self._per_document() or self.train_step_handler.every_stage_reads_batches

    def _agree(self, ok: bool) -> bool:
        """True if every rank says ``ok`` (one tiny all-reduce)."""
        if not self.dist.distributed:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def num_devices(self) -> int:
        """Devices sharing the step's tokens: the world size (MFU is per device)."""
        return self.dist.world_size

    def max_over_ranks(self, value: int) -> int:
        """The largest ``value`` over all ranks (one tiny all-reduce; the stop decision)."""
        if not self.dist.distributed:
            return value
        flag = torch.tensor([value], dtype=torch.int32, device=self.dist.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def _advance_without_reading(self, n_mb: int) -> None:
        loader = self.data.train_loader
        step_samples = n_mb * self.config.training.micro_batch_size * self.dims.dp
        loader.load_state_dict(
            {"consumed_samples": loader.consumed_samples + step_samples, "mode": "train"}
        )

    def sum_expert_counts(self, counts: torch.Tensor) -> None:
        """Sum MoE experts' step counts over the ranks of this pipeline stage (every other
        parallelism's ranks hold other tokens of the same layers, or the same ones)."""
        if self._stage_group is not None:
            dist.all_reduce(counts, group=self._stage_group)

    def loss_divisor(self, num_microbatches: int) -> int:
        """The gradient synchronisation's divisor (:meth:`PlainGradSync.loss_divisor`: this
        rank's micro-batches, or the global number under the exact synchronisation)."""
        return self.engine.sync.loss_divisor(num_microbatches)

    def forward_backward(self, batches: Iterator[dict[str, Any]], plan: StepPlan) -> torch.Tensor:
        """Forward and backward of one global batch through the engine (all ranks together).

        Raises:
            StopIteration: on every rank, when any rank ran out of training data.
        """
        n_mb = plan.num_microbatches
        micro_batches: list[dict[str, torch.Tensor]] = []
        ok = True
        if self.engine.needs_batches(self._every_stage_reads()):
            try:
                micro_batches = [self.step_batch(next(batches)) for _ in range(n_mb)]
            except StopIteration:
                ok = False
        if not self._agree(ok):
            raise StopIteration
        if not micro_batches:
            self._advance_without_reading(n_mb)
        return self.engine.forward_backward(micro_batches, plan, step=self.train_step_handler)

    def reduce_logged(self) -> dict[str, float]:
        """The last step's logged values, averaged over micro-batches and data-parallel ranks."""
        return self.engine.reduce_logged()

    def holds_last_stage(self) -> bool:
        """Whether this rank holds the last pipeline stage (computes the logits)."""
        return self.engine.has_last_stage

    def validation_pass(
        self, observer: LogitsObserver | None
    ) -> tuple[float | None, list[dict[str, float]]] | None:
        """The forward passes of an evaluation through the engine (all ranks together).

        ``eval_iters`` global batches from the start of the validation data (a
        fine-tuning table: all of it, the last global batch perhaps with fewer
        micro-batches); ``observer`` runs on the last stage's ranks.

        Returns:
            The mean loss and the logged values (per global batch; per micro-batch in
            the global order under the exact synchronisation,
            :meth:`~epochal.parallel.grad_sync.PlainGradSync.evaluation_record`), or
            None without validation data.
        """
        loader = self.data.valid_loader
        iters = self.config.training.eval_iters
        if loader is None or iters == 0:
            return None
        n_mb = self.num_microbatches()
        if self.data.whole_validation:  # every micro-batch, the last group possibly shorter
            sizes = [min(n_mb, len(loader) - i) for i in range(0, len(loader), n_mb)]
        else:
            sizes = [n_mb] * min(iters, len(loader) // n_mb)
        if not sizes:
            return None
        for part in self.model_parts:
            part.eval()
        reading = self.engine.needs_batches(self._every_stage_reads())
        it = iter(loader) if reading else None
        record = self.engine.sync.evaluation_record()
        for n in sizes:
            mbs = [self.step_batch(next(it)) for _ in range(n)] if it is not None else []
            loss = self.engine.eval_loss(
                mbs,
                num_microbatches=n,
                step=self.train_step_handler,
                on_logits=observer,
            )
            record.add(loss)
        for part in self.model_parts:
            part.train()
        return record.mean(), record.logged


def print_line(message: str) -> None:
    """Print one progress line of the data preparation (the logging rank's ``log``)."""
    print(message, flush=True)


def _all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, by rank (a collective; checkpoint hashing and verification)."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def export_consolidated(
    folder: str | os.PathLike, out_file: str | os.PathLike, **kwargs: Any
) -> dict[str, tuple[int, ...]]:
    """Write the model of checkpoint ``folder`` (any layout) to one safetensors file (one process).

    Uses the training layer's safe DCP reader (no arbitrary unpickling). See
    :func:`epochal.parallel.checkpoint.consolidate_checkpoint` for ``kwargs``.
    """
    folder = Path(folder)
    return consolidate_checkpoint(
        folder, out_file, reader=SafeFileSystemReader(folder), planner=SafeLoadPlanner(), **kwargs
    )
