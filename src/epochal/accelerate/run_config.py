"""The epochal training configuration an Accelerate script's objects describe.

``prepare`` gathers the transformers model (epochal's model config), the user's
optimizer (learning rate, weight decay, Adam's betas and epsilon), the dummy
scheduler and the plugin (schedule, layout, clipping), the loaders (micro-batch
size, sequence lengths) and the accelerator (seed, device, precision) into one
:class:`~epochal.train.config.TrainConfig`, checked by the trainer's own rules and
written next to every ``save_state`` checkpoint as ``config.toml``.

Schedule lengths in optimizer steps (see :mod:`epochal.accelerate.plugin`):
``train_iters`` / ``lr_warmup_iters`` / ``lr_decay_iters`` of the plugin as given;
else ``*_samples`` divided by the global batch size; else the dummy scheduler's
``total_num_steps`` / ``warmup_num_steps`` divided by ``num_micro_batches x
data-parallel size`` (at least one step). Without a scheduler the learning rate
stays the optimizer's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from epochal.accelerate.plugin import MegatronLMDummyScheduler, MegatronLMPlugin, PluginError
from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.config import ParallelConfig
from epochal.train.config import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelSection,
    OptimizerConfig,
    SchedulerConfig,
    TrainConfig,
    TrainingConfig,
)

__all__ = ["RunShape", "build_train_config", "schedule_steps"]


@dataclass
class RunShape:
    """What the loaders and the accelerator fix.

    Attributes:
        micro_batch_size: samples per micro-batch per data-parallel rank.
        data_parallel: the data-parallel size.
        seq_length: (encoder) tokens per sample as trained (after padding).
        decoder_seq_length: T5's decoder tokens per sample (None otherwise).
        seed: training seed (dropout streams, data order).
        device: ``"cpu"`` or ``"cuda"``.
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"``.
        run_dir: the project directory (recorded in the configuration).
        num_workers: the train loader's workers (recorded).
        data_options: more ``[data]`` options (``MegatronLMDummyDataLoader``'s).
        eval_iters: validation batches per evaluation (``MegatronLMDummyDataLoader``).
    """

    micro_batch_size: int
    data_parallel: int
    seq_length: int
    decoder_seq_length: int | None
    seed: int
    device: str
    mixed_precision: str
    run_dir: str
    num_workers: int = 0
    data_options: dict[str, Any] = field(default_factory=dict)
    eval_iters: int = 0


def _steps(
    iters: int | None, samples: int | None, batches: int | None, g: int, per: int
) -> int | None:
    if iters is not None:
        return int(iters)
    if samples is not None:
        return int(samples) // g
    if batches is not None:
        return int(batches) // per
    return None


def schedule_steps(
    plugin: MegatronLMPlugin, scheduler: MegatronLMDummyScheduler | None
) -> dict[str, Any]:
    """``train_iters``, ``lr_warmup_iters``, ``lr_decay_iters`` (optimizer steps) and the style.

    Raises:
        PluginError: a dummy scheduler without ``total_num_steps`` and no plugin length.
    """
    g = plugin.global_batch_size
    per = plugin.num_micro_batches * plugin.data_parallel_size
    assert g is not None
    if scheduler is None:
        return {"train_iters": 1, "warmup": 0, "decay": None, "style": "constant", "fraction": None}
    total = _steps(plugin.train_iters, plugin.train_samples, scheduler.total_num_steps, g, per)
    if total is None:
        raise PluginError(
            "MegatronLMDummyScheduler needs total_num_steps (or MegatronLMPlugin.train_iters / "
            "train_samples)"
        )
    warmup = _steps(plugin.lr_warmup_iters, plugin.lr_warmup_samples, None, g, per)
    fraction = plugin.lr_warmup_fraction if warmup is None else None
    if warmup is None and fraction is None:
        warmup = int(scheduler.warmup_num_steps or 0) // per
    decay = _steps(plugin.lr_decay_iters, plugin.lr_decay_samples, None, g, per)
    return {
        "train_iters": max(1, total),
        "warmup": warmup or 0,
        "decay": decay,
        "style": plugin.lr_decay_style,
        "fraction": fraction,
    }


def _optimizer_options(
    optimizer: torch.optim.Optimizer, plugin: MegatronLMPlugin
) -> dict[str, Any]:
    d = optimizer.defaults
    betas = d.get("betas", (0.9, 0.999))
    return {
        "lr": float(d.get("lr", 0.0)),
        "min_lr": float(plugin.min_lr),
        "weight_decay": float(d.get("weight_decay", 0.0)),
        "start_weight_decay": plugin.start_weight_decay,
        "end_weight_decay": plugin.end_weight_decay,
        "adam_beta1": float(betas[0]),
        "adam_beta2": float(betas[1]),
        "adam_eps": float(d.get("eps", 1e-8)),
        "clip_grad": float(plugin.gradient_clipping),
    }


def build_train_config(
    model_config: ModelConfig,
    plugin: MegatronLMPlugin,
    optimizer: torch.optim.Optimizer | None,
    scheduler: MegatronLMDummyScheduler | None,
    shape: RunShape,
) -> TrainConfig:
    """The checked :class:`TrainConfig` of a prepared script (see the module docstring).

    Raises:
        PluginError: an option that does not fit (named as the user set it: a plugin
            field, the scheduler's steps, the optimizer's learning rate).
    """
    steps = schedule_steps(plugin, scheduler)
    options = (
        _optimizer_options(optimizer, plugin)
        if optimizer is not None
        else {"lr": 0.0, "clip_grad": float(plugin.gradient_clipping)}
    )
    parallel = plugin.parallel_options()
    if model_config.head != "mlm":  # a classifier's few logits: no vocabulary to shard
        parallel["loss_parallel"] = False
    chunks = plugin.virtual_pipeline(model_config.num_layers)
    if chunks > 1:
        parallel.update(virtual_pipeline=chunks, pipeline_schedule="interleaved_1f1b")
    data = {"seq_length": shape.seq_length, "num_workers": shape.num_workers, **shape.data_options}
    if shape.decoder_seq_length is not None:
        data["seq_length_decoder"] = shape.decoder_seq_length
    section = ModelSection(
        **{f.name: getattr(model_config, f.name) for f in dataclasses.fields(ModelConfig)}
    )
    wd_style = plugin.weight_decay_incr_style
    try:
        return TrainConfig(
            run_dir=shape.run_dir,
            model=section,
            data=DataConfig(**data),
            training=TrainingConfig(
                micro_batch_size=shape.micro_batch_size,
                global_batch_size=plugin.global_batch_size,
                train_iters=steps["train_iters"],
                seed=shape.seed,
                eval_interval=0,
                eval_iters=shape.eval_iters,
                device=shape.device,
                bf16=shape.mixed_precision == "bf16",
                fp16=shape.mixed_precision == "fp16",
                exit_signal_handler=False,
            ),
            optimizer=OptimizerConfig(**options),
            scheduler=SchedulerConfig(
                lr_decay_style=steps["style"],
                lr_warmup_iters=steps["warmup"],
                lr_warmup_fraction=steps["fraction"],
                lr_decay_iters=steps["decay"],
                weight_decay_incr_style=wd_style,
            ),
            checkpoint=CheckpointConfig(save_interval=0, keep_last=1, resume="never"),
            logging=LoggingConfig(progress=False, tensorboard=False),
            parallel=ParallelConfig(data_parallel=shape.data_parallel, **parallel),
        )
    except ConfigError as exc:
        raise PluginError(f"the prepared objects make an invalid run: {exc}") from exc
