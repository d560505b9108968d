"""``ParallelConfig``: the ``[parallel]`` section of a training configuration.

Names follow Megatron-LM's command-line arguments where one exists
(``tensor_model_parallel_size`` -> ``tensor_parallel``, ``--sequence-parallel``,
``--decoder-last-pipeline-num-layers``, ``--use-distributed-optimizer``,
``--recompute-granularity/-method/-num-layers``).

The data-parallel size is derived from the world size
(``world_size / (tensor_parallel * context_parallel * pipeline_parallel)``); setting
``data_parallel`` only checks it (and tells ``epochal train`` how many processes
to launch when it is not already running under ``torchrun``).

Processes ``epochal train`` launches by itself (:meth:`ParallelConfig.launch_world_size`):
``tensor_parallel * context_parallel * pipeline_parallel * DP`` with ``DP`` the
``data_parallel`` given, else ``expert_parallel`` (1 without experts). That is
Megatron-LM's world-size rule, ``world = TP * CP * PP * DP`` with the expert-parallel
size carved from the ranks of a model replica's data-parallel groups; Megatron-Core
folds them over ``CP * DP``, epochal over the data-parallel ranks only (``expert_parallel``
divides ``DP``), so ``expert_parallel=2`` alone runs DP2 x EP2 on two processes. Every
degree given alone therefore starts the processes it needs.

Every invalid value raises :class:`~epochal.model.config.ConfigError` naming the
option (``parallel.<field>`` once the config tree re-raises it).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

from epochal._checks import check_fields, checked, require

__all__ = [
    "DP_SHARDING",
    "PIPELINE_SCHEDULES",
    "RECOMPUTE_GRANULARITIES",
    "RECOMPUTE_METHODS",
    "ParallelConfig",
]

PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b"]
DpSharding = Literal["none", "optimizer", "full"]
ContextExchange = Literal["auto", "allgather", "a2a", "p2p"]
ContextAccumulation = Literal["step", "micro_batch"]
RecomputeGranularity = Literal["none", "full", "selective"]
RecomputeMethod = Literal["uniform", "block"]
PIPELINE_SCHEDULES: tuple[str, ...] = typing.get_args(PipelineSchedule)
DP_SHARDING: tuple[str, ...] = typing.get_args(DpSharding)
RECOMPUTE_GRANULARITIES: tuple[str, ...] = typing.get_args(RecomputeGranularity)
RECOMPUTE_METHODS: tuple[str, ...] = typing.get_args(RecomputeMethod)
#: the longest process-group timeout, in minutes (one year)
_MAX_TIMEOUT_MINUTES = 60 * 24 * 365


@dataclass(kw_only=True)
class ParallelConfig:
    """How one training job is split over processes.

    Attributes:
        tensor_parallel: tensor-parallel size (Megatron's
            ``tensor_model_parallel_size``); >= 1. Must divide the number of
            attention heads, the MLP width and the padded vocabulary; the number
            of key/value groups must be divisible by it, or divide it (then the
            key/value projections are replicated, e.g. multi-query attention).
        sequence_parallel: with ``tensor_parallel > 1``, shard the sequence
            dimension of the norms, dropout and residual stream across the
            tensor-parallel ranks (Megatron's ``--sequence-parallel``:
            reduce-scatter / all-gather instead of all-reduce). Needs
            ``data.seq_length`` divisible by ``tensor_parallel``.
        loss_parallel: with ``tensor_parallel > 1``, compute the cross-entropy on
            vocabulary-sharded logits without gathering them (Megatron's
            ``vocab_parallel_cross_entropy``). A custom loss function always
            receives gathered logits.
        context_parallel: context-parallel size (Megatron's
            ``--context-parallel-size``); >= 1. Every sequence is cut into
            ``2 * context_parallel`` chunks and context-parallel rank ``r``
            holds chunks ``r`` and ``2 * context_parallel - 1 - r`` (Megatron's
            load balancing for causal attention); keys and values are
            exchanged in attention (:mod:`epochal.parallel.context_parallel`).
            Needs ``data.seq_length`` divisible by ``2 * context_parallel``
            (packed rows are padded to it: :meth:`packed_row_multiple`; they are
            cut as whole rows, documents kept apart by a document mask).
            Composes with tensor, sequence, pipeline and data parallelism and
            recompute. Weights are not sharded: gradients are summed over the
            context-parallel ranks.
        context_parallel_exchange: how attention meets the other ranks' tokens
            (Megatron-Core's ``--cp-comm-type``): ``auto`` (the default: ``a2a`` where
            the heads split over the context-parallel ranks, else ``p2p`` without
            attention dropout, else ``allgather``:
            :func:`~epochal.parallel.context_parallel.resolve_exchange`), ``allgather`` (each
            rank gathers every rank's keys and values and attends with its own
            queries; any head count; a layer's keys and values of the whole
            sequence per rank) or ``a2a`` (DeepSpeed-Ulysses: an all-to-all gives
            each rank ``heads / context_parallel`` whole heads over the whole
            sequence, and the output goes back the same way; each head is one
            process's kernel call, and the keys and values a rank holds fall as
            ``1 / context_parallel``; needs a tensor-parallel rank's query and
            key/value heads to split over the context-parallel ranks) or ``p2p`` (a
            ring: keys and values passed around the group while each rank computes
            its queries against the block it holds, the partial results merged by
            their log-sum-exp; any head count, keys and values per rank ``2 /
            context_parallel`` of the sequence's; no attention dropout:
            :mod:`epochal.parallel.context_ring`). Canonical units
            (``training.layout_invariant``) always exchange heads.
        expert_parallel: expert-parallel size (Megatron's
            ``--expert-model-parallel-size``); >= 1. The routed experts of every
            mixture-of-experts layer are split over ``expert_parallel`` ranks
            carved from the data-parallel ranks (it must divide the
            data-parallel size and ``model.num_experts``): each holds
            ``num_experts / expert_parallel`` experts, tokens travel to their
            expert's rank and back with all-to-all
            (:mod:`epochal.parallel.expert_parallel`). Everything else stays
            data-parallel; expert weights are reduced over the ranks that hold
            the same experts. Combines with ``context_parallel`` (each rank
            dispatches its own sequence chunks) and ``tensor_parallel`` (each
            expert's weights split over the tensor-parallel ranks, as
            Megatron's expert tensor-parallel size equal to
            ``tensor_parallel``).
        pipeline_parallel: number of pipeline stages (ranks); >= 1.
        virtual_pipeline: model chunks per pipeline rank (Megatron's
            ``virtual_pipeline_model_parallel_size``); > 1 needs the
            ``interleaved_1f1b`` schedule.
        pipeline_schedule: ``gpipe`` (all forwards, then all backwards),
            ``1f1b`` (Megatron's default without interleaving) or
            ``interleaved_1f1b`` (Megatron's interleaved schedule, with
            ``virtual_pipeline`` chunks per rank).
        decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers:
            Megatron's options for an uneven split: the number of transformer
            layers on the first / last pipeline rank (None = even split). The
            other ranks share the remaining layers evenly.
        data_parallel: None (derived from the world size) or the expected
            data-parallel size (checked; used for the process count when
            ``epochal train`` launches itself).
        dp_sharding: ``none`` (replicated parameters and optimizer state,
            gradients all-reduced: DDP), ``optimizer`` (the distributed optimizer:
            optimizer state and gradients sharded over data-parallel ranks,
            parameters gathered once per step and kept for the backward: ZeRO-2,
            FSDP2 with ``reshard_after_forward=False``) or ``full`` (parameters
            sharded too, gathered per layer in forward and backward: ZeRO-3,
            FSDP2).
        invariant_degree: with ``training.layout_invariant``, the number of fixed
            chunks every sum over a dimension that tensor or sequence parallelism
            splits is computed in (a power of two; every ``tensor_parallel`` that
            divides it, with or without ``sequence_parallel``, then trains the bits
            of one process: :mod:`epochal.parallel.canonical`). 1 keeps the
            data-parallel rule only (tensor-parallel layouts then agree with each
            other, not with one process). Needs the hidden size, MLP width, query
            and key/value widths, padded vocabulary and sequence length divisible
            by it; GPT models without experts or QK-norm.
        invariant_context_degree: in canonical units, the largest
            ``context_parallel`` whose weight gradients are summed the way one process
            sums them (a power of two; every context-parallel size that divides it
            trains the same bits): each sequence's tokens are cut into ``2 x`` this
            many chunks, and every weight gradient is one product per chunk added as
            a fixed tree. More chunks cost more (each product writes a whole weight
            gradient): 1 keeps one product per weight over the whole sequence. 0 (the
            default) takes ``context_parallel`` and is written into the run's
            configuration as that number, so resuming or replaying the run on fewer
            context-parallel ranks keeps it.
        invariant_context_accumulation: in canonical units with
            ``invariant_context_degree`` above 1, the order in which a linear's weight
            gradient adds its ``C`` chunk sums and the step's micro-batches
            (:mod:`epochal.parallel.canonical_step_sum`). ``step`` (the default):
            each chunk sum accumulated over the micro-batches on its own, the ``C``
            added once per step, so context-parallel ranks sum their weight gradients
            once per step as plain context parallelism does; a rank that holds
            several chunks of the sequence (``context_parallel`` below the degree)
            keeps one gradient buffer per chunk (one process replaying a ``C = 4``
            run: four; under data parallelism each chunk's sent in the ordered
            reduction, ``C / context_parallel`` times a weight's bytes), and
            ``torch.compile`` is then refused. ``micro_batch``: each micro-batch's
            weight gradient completed, then accumulated: one buffer on every layout,
            the context-parallel group summing every micro-batch's gradients (a
            weight's bytes per micro-batch: 1.2x the plain CP2 step at 512 tokens,
            where ``step`` costs 1.07x). Both are exact; a run keeps one order for its
            whole life (embedding tables, norms and biases complete per micro-batch
            in either).
        recompute_granularity: ``none``, ``full`` (recompute whole transformer
            layers in the backward) or ``selective`` (keep the matmul and
            attention outputs, recompute the pointwise ops: norms, activations,
            dropout, rotary).
        recompute_method: for ``full``: ``uniform`` (every layer is recomputed,
            in groups of ``recompute_num_layers`` that store one input each) or
            ``block`` (only the first ``recompute_num_layers`` layers of each
            pipeline chunk are recomputed), as in Megatron.
        recompute_num_layers: see ``recompute_method`` (>= 1).
        nproc_per_node: processes to launch per node when ``epochal train`` is
            not under ``torchrun`` (0 = ``tensor_parallel * pipeline_parallel *
            context_parallel * (data_parallel or expert_parallel)``: see
            :meth:`launch_world_size`). Ignored under an outer launcher.
        backend: process-group backend: ``auto`` (NCCL on CUDA, gloo on CPU),
            ``gloo`` or ``nccl``.
        timeout_minutes: the process group's timeout in minutes (a float:
            ``0.05`` is 3 s): a collective that makes no progress for that long
            (a rank stopped, hung or dead) raises on the ranks waiting in it and
            ``epochal train`` exits with an error naming the rank. None: torch's
            default (30 minutes for gloo, 10 for NCCL).
    """

    tensor_parallel: int = checked(1, ge=1)
    sequence_parallel: bool = checked(False)
    loss_parallel: bool = checked(True)
    context_parallel: int = checked(1, ge=1)
    context_parallel_exchange: ContextExchange = checked("auto")
    expert_parallel: int = checked(1, ge=1)
    pipeline_parallel: int = checked(1, ge=1)
    virtual_pipeline: int = checked(1, ge=1)
    pipeline_schedule: PipelineSchedule = checked("1f1b")
    decoder_first_pipeline_num_layers: int | None = checked(None, ge=0, none="even split")
    decoder_last_pipeline_num_layers: int | None = checked(None, ge=0, none="even split")
    data_parallel: int | None = checked(None, ge=1, none="derived from the world size")
    dp_sharding: DpSharding = checked("none")
    invariant_degree: int = checked(8, ge=1, le=1024)
    invariant_context_degree: int = checked(0, ge=0, le=1024, note="0 = context_parallel")
    invariant_context_accumulation: ContextAccumulation = checked("step")
    recompute_granularity: RecomputeGranularity = checked("none")
    recompute_method: RecomputeMethod = checked("uniform")
    recompute_num_layers: int = checked(1, ge=1)
    nproc_per_node: int = checked(0, ge=0, note="0 = derived")
    backend: Literal["auto", "gloo", "nccl"] = checked("auto")
    timeout_minutes: float | None = checked(
        None,
        gt=0,
        le=_MAX_TIMEOUT_MINUTES,
        none="torch's default",
        text="None (torch's default) or minutes > 0 and <= one year",
    )

    def __post_init__(self) -> None:
        if self.invariant_context_degree == 0 and isinstance(self.context_parallel, int):
            self.invariant_context_degree = self.context_parallel
        self.validate()

    def validate(self) -> None:
        """Check each field's type and range, then the rules between fields.

        Raises:
            ConfigError: naming the first bad field.
        """
        check_fields(self)
        require(
            not self.sequence_parallel or self.tensor_parallel > 1,
            "sequence_parallel",
            f"needs tensor_parallel > 1, got tensor_parallel={self.tensor_parallel}",
        )
        for name in ("invariant_degree", "invariant_context_degree"):
            value = getattr(self, name)
            require(value & (value - 1) == 0, name, f"must be a power of two, got {value}")
        if self.virtual_pipeline > 1:
            require(
                self.pipeline_schedule == "interleaved_1f1b",
                "virtual_pipeline",
                f"> 1 needs pipeline_schedule='interleaved_1f1b', got {self.pipeline_schedule!r}",
            )
        if self.pipeline_schedule == "interleaved_1f1b":
            require(
                self.pipeline_parallel > 1,
                "pipeline_schedule",
                f"'interleaved_1f1b' needs pipeline_parallel > 1, got {self.pipeline_parallel}",
            )
        if self.pipeline_parallel == 1:
            for name in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
                require(getattr(self, name) is None, name, "needs pipeline_parallel > 1")

    @property
    def model_parallel_size(self) -> int:
        """``tensor_parallel * context_parallel * pipeline_parallel`` (processes per model replica)."""
        return self.tensor_parallel * self.context_parallel * self.pipeline_parallel

    def packed_row_multiple(self, canonical: bool = False) -> int:
        """The multiple a packed row's length (``data.pack_sequences``) is padded to.

        The tensor-parallel size under sequence parallelism (the row is sharded over
        it), ``2 * context_parallel`` under context parallelism (the row is cut into
        that many chunks), their least common multiple with both, else 1. In
        canonical units (``canonical``) also ``2 * max(invariant_degree,
        invariant_context_degree)``, the token sums' sequence chunks: a multiple that
        does not depend on the layout, so every layout packs the same rows.
        """
        multiple = self.tensor_parallel if self.sequence_parallel else 1
        if self.context_parallel > 1:
            multiple = math.lcm(multiple, 2 * self.context_parallel)
        if canonical:
            chunks = 2 * max(self.invariant_degree, self.invariant_context_degree)
            multiple = math.lcm(multiple, chunks)
        return multiple

    @property
    def launch_data_parallel(self) -> int:
        """The data-parallel size of a self-launched run: ``data_parallel``, else ``expert_parallel``.

        Expert-parallel ranks are carved from the data-parallel ranks, so the smallest
        data-parallel size that holds ``expert_parallel`` groups is ``expert_parallel``
        itself (1 without expert parallelism).
        """
        return self.data_parallel or self.expert_parallel

    def launch_world_size(self) -> int:
        """Number of processes ``epochal train`` launches on one node when not under ``torchrun``.

        ``nproc_per_node`` when set, else ``tensor_parallel * context_parallel *
        pipeline_parallel * launch_data_parallel`` (the module docstring).
        """
        if self.nproc_per_node:
            return self.nproc_per_node
        return self.model_parallel_size * self.launch_data_parallel

    def describe_launch(self) -> str:
        """The layout of the sizes given, e.g. ``"TP2 x DP2 x EP2"`` (``"one process"`` for 1).

        The data-parallel size is :attr:`launch_data_parallel`; degrees of 1 are left
        out; ``EP`` comes after ``DP`` because its ranks are data-parallel ranks (the
        product of the others is the process count).
        """
        parts = [
            f"{name}{size}"
            for name, size in (
                ("TP", self.tensor_parallel),
                ("CP", self.context_parallel),
                ("PP", self.pipeline_parallel),
                ("DP", self.launch_data_parallel),
                ("EP", self.expert_parallel),
            )
            if size > 1
        ]
        return " x ".join(parts) or "one process"
