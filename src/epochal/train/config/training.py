"""The ``[training]`` section: batch sizes, iterations, seed, evaluation, device, precision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from epochal._checks import check_fields, checked, require

__all__ = [
    "TrainingConfig",
]


# -------------------------------------------------------------------- training
@dataclass(kw_only=True)
class TrainingConfig:
    """The ``[training]`` section.

    Attributes:
        micro_batch_size: samples per forward/backward pass (>= 1).
        global_batch_size: samples per optimizer step (a multiple of
            ``micro_batch_size * data_parallel_size``); the number of micro-batches
            (gradient accumulation steps) is their ratio.
        rampup_batch_size: Megatron's ``[start, increment, ramp_samples]``: the global
            batch grows from ``start`` by ``increment`` over ``ramp_samples`` samples
            (None = constant). The LR schedule still counts optimizer steps (Megatron
            counts samples), so warmup/decay lengths are in steps.
        train_iters: optimizer steps to train (>= 1).
        seed: seed of the weights, dropout and data order.
        eval_interval: evaluate every this many steps (0 = never; also at the end).
        eval_iters: validation batches (of ``global_batch_size`` samples) per evaluation;
            a fine-tuning run evaluates its whole validation table every time (any
            value > 0; 0 = no evaluation).
        device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
        bf16: run forward/backward under bfloat16 autocast (parameters and
            optimizer state stay float32).
        fp16: run forward/backward under float16 autocast with Megatron's loss
            scaling (:mod:`epochal.train.optim.loss_scaler`; parameters and optimizer
            state stay float32); a step whose gradients overflow is skipped (no
            optimizer or learning-rate step) and the scale lowered. Not with ``bf16``;
            refused on a device without float16 autocast.
        loss_scale: a constant loss scale (Megatron's ``--loss-scale``); None =
            dynamic scaling with the four options below.
        initial_loss_scale: the first dynamic scale (``--initial-loss-scale``).
        min_loss_scale: the dynamic scale's floor (``--min-loss-scale``).
        loss_scale_window: overflow-free steps before the scale doubles
            (``--loss-scale-window``).
        hysteresis: overflowing steps before the scale halves (``--hysteresis``).
        compile: ``torch.compile`` each transformer block.
        compile_loss: with ``compile``, also compile the per-token cross-entropy, so the
            float32 upcast of the ``[b, s, vocab]`` logits is fused into the loss kernel
            instead of materialized (not under vocabulary-parallel loss).
        loss_chunk_tokens: > 0: compute the cross-entropy over chunks of this many tokens,
            each recomputed in the backward, so float32 logits exist for one chunk at a
            time (equal losses; not under vocabulary-parallel loss); 0 = in one piece.
        fused_adamw: ``torch.optim.AdamW(fused=True)`` (one kernel per parameter group
            on CUDA; also on the CPU). Same update up to float rounding.
        attention_backend: the scaled-dot-product attention kernels allowed:
            ``auto`` (PyTorch's choice), ``flash``, ``efficient``, ``cudnn`` or ``math``
            (``torch.nn.attention.sdpa_kernel``); a kernel that cannot run the inputs
            is an error from PyTorch.
            ``compile_loss``, ``loss_chunk_tokens`` and ``attention_backend`` act in the
            single-process trainer; a parallel layout (``epochal.parallel``'s engine) uses
            the plain loss and PyTorch's kernel choice. ``fused_adamw`` acts in both.
        exit_signal_handler: on SIGTERM or SIGINT, finish the current step, save a
            checkpoint and exit 0 (every rank after the same step); Megatron's
            ``--exit-signal-handler``, on by default here.
        exit_duration_mins: stop (saving first) once this many minutes of wall time
            have passed since the trainer was created (> 0; None = no limit).
        exit_interval: stop (saving first) after a step that is a multiple of this
            (>= 1; None = never).
        train_step: a custom train step class ``"package.module:Class"`` (a
            subclass of ``epochal.train.GPTTrainStep`` / ``BertTrainStep``;
            Accelerate's ``custom_train_step_class``); empty = the model type's step.
        train_step_kwargs: keyword arguments of that class (a TOML table;
            Accelerate's ``custom_train_step_kwargs``).
        memory_check: before allocating the model, refuse a run whose weights,
            gradients and AdamW state (16 bytes per trainable parameter, 4 per frozen
            one, divided by the parallel layout) and one step's activations exceed the
            device's free memory (:mod:`epochal.train.run_checks.state_memory`); false
            skips the check.
        eval_callback: an evaluation callback ``"package.module:function"``,
            called as ``fn(batch, logits) -> {name: number} | None`` for every
            validation micro-batch (see ``Trainer.add_eval_callback``); its values
            are logged with the evaluation under ``<name>``. Empty = none.
        layout_invariant: the same bits under any data-parallel size and gradient
            accumulation (micro-batch size fixed): gradients, losses and logged
            values summed in the global micro-batch order, an exact gradient norm,
            dropout keyed by the micro-batch (``docs/concepts/layout-invariance.md``).
            On in every preset; off by default because the ordered reduction
            exchanges gradients once per micro-batch (up to ~12% step time on CPU
            data parallelism with small micro-batches, see ``BENCHMARKS.md``).
        deterministic_kernels: ``torch.use_deterministic_algorithms(True)`` and
            ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (GPU kernels that give the same
            bits on every run, some slower; nothing changes on the CPU).
    """

    micro_batch_size: int = checked(4, ge=1)
    global_batch_size: int = checked(16, ge=1)
    rampup_batch_size: list[int] | None = None
    train_iters: int = checked(300, ge=1)
    seed: int = checked(1234, ge=0, lt=2**32, text="in [0, 2**32)")
    eval_interval: int = checked(100, ge=0)
    eval_iters: int = checked(10, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    fp16: bool = False
    loss_scale: float | None = checked(None, gt=0, text="> 0 (or unset for dynamic scaling)")
    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = checked(1.0, gt=0)
    loss_scale_window: int = checked(1000, ge=1)
    hysteresis: int = checked(2, ge=1)
    compile: bool = False
    compile_loss: bool = False
    loss_chunk_tokens: int = checked(0, ge=0, note="0 = one piece")
    fused_adamw: bool = False
    attention_backend: Literal["auto", "flash", "efficient", "cudnn", "math"] = checked("auto")
    exit_signal_handler: bool = True
    exit_duration_mins: float | None = checked(None, gt=0, text="> 0 (or unset)")
    exit_interval: int | None = checked(None, ge=1, text=">= 1 (or unset)")
    train_step: str = ""
    train_step_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_callback: str = ""
    memory_check: bool = True
    layout_invariant: bool = False
    deterministic_kernels: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        require(
            not (self.fp16 and self.bf16),
            "fp16",
            "and training.bf16 are both true; pick one precision",
        )
        require(
            self.initial_loss_scale >= self.min_loss_scale,
            "initial_loss_scale",
            f"must be >= training.min_loss_scale={self.min_loss_scale}, got {self.initial_loss_scale}",
        )
        require(
            not self.eval_callback or self.eval_callback.count(":") == 1,
            "eval_callback",
            f"must look like 'package.module:function', got {self.eval_callback!r}",
        )
        require(
            not self.train_step or self.train_step.count(":") == 1,
            "train_step",
            f"must look like 'package.module:Class', got {self.train_step!r}",
        )
        require(
            not self.train_step_kwargs or bool(self.train_step),
            "train_step_kwargs",
            "is set but training.train_step is not",
        )
        require(
            self.global_batch_size % self.micro_batch_size == 0,
            "global_batch_size",
            f"must be a multiple of micro_batch_size={self.micro_batch_size}, got {self.global_batch_size}",
        )
        if self.rampup_batch_size is not None:
            r = self.rampup_batch_size
            require(
                len(r) == 3
                and r[0] >= 1
                and r[1] >= 1
                and r[2] >= 0
                and r[0] <= self.global_batch_size,
                "rampup_batch_size",
                f"must be [start >= 1, increment >= 1, ramp_samples >= 0] with start <= "
                f"global_batch_size={self.global_batch_size}, got {r}",
            )
