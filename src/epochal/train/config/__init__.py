"""The training configuration: one tree of ``@dataclass(kw_only=True)`` sections.

    TrainConfig
      run_dir                      where checkpoints, metrics, plots and the resolved config go
      model      ModelSection      ModelConfig's fields; vocab_size / max_position_embeddings optional
      data       DataConfig        data paths (Megatron-style), split, sequence length, tokenizer
      training   TrainingConfig    batch sizes, iterations, seed, evaluation, device, bf16, compile
      optimizer  OptimizerConfig   AdamW and gradient clipping (Megatron's names)
      scheduler  SchedulerConfig   LR warmup/decay and weight-decay increment
      checkpoint CheckpointConfig  save interval, keep-last-k, resume
      logging    LoggingConfig     progress bar, TensorBoard, log interval
      parallel   ParallelConfig    tensor/sequence/pipeline/data parallelism, recompute (epochal.parallel)
      finetune   FinetuneConfig    labelled tables of a fine-tuning run (model.head), head LR
      sft        SFTConfig         chat / prompt-completion rows of a GPT fine-tuning run

Sources, later ones winning: a preset (``tiny``, ``gpt2-small``), a TOML file
(tables named like the sections), then ``--section.key=value`` overrides whose
values are TOML literals (``--model.hidden_size=256``, ``--data.data_path=["a","b"]``;
a value that is not valid TOML is taken as a string: ``--scheduler.lr_decay_style=linear``).

Every unknown key or invalid value raises :class:`~epochal.model.config.ConfigError`
naming the dotted option (``optimizer.lr``) and the allowed range; an unknown key
names the closest known ones. :func:`describe_options` lists every option with its
type, default, description (from the section classes' docstrings) and the Megatron-LM /
BioNeMo flag it mirrors (``epochal train --list-options`` prints it). Without
``run_dir``, :func:`build_config` names the run directory after the run
(:mod:`epochal.train.config.run_name`).
:func:`to_toml` writes the resolved tree (the trainer stores it next to the
checkpoints); ``None`` values are omitted (every optional field defaults to None).

More sections (e.g. ``parallel``) are added by declaring another field on
:class:`TrainConfig`; the loader, the overrides and the TOML writer handle any
dataclass section.
"""

from epochal.train.config.checkpoint import CheckpointConfig
from epochal.train.config.data import DataConfig
from epochal.train.config.finetune import FinetuneConfig
from epochal.train.config.log import LoggingConfig
from epochal.train.config.model import ModelSection, model_config_from_section, position_length
from epochal.train.config.optimizer import OptimizerConfig
from epochal.train.config.options import OptionInfo, describe_options
from epochal.train.config.scheduler import SchedulerConfig
from epochal.train.config.sft import SFTConfig
from epochal.train.config.toml_io import (
    EXCLUSIVE_OPTIONS,
    build_config,
    config_from_dict,
    config_from_saved,
    parse_overrides,
    to_toml,
)
from epochal.train.config.training import TrainingConfig
from epochal.train.config.tree import TrainConfig

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "EXCLUSIVE_OPTIONS",
    "FinetuneConfig",
    "LoggingConfig",
    "ModelSection",
    "OptimizerConfig",
    "OptionInfo",
    "SFTConfig",
    "SchedulerConfig",
    "TrainConfig",
    "TrainingConfig",
    "build_config",
    "config_from_dict",
    "config_from_saved",
    "describe_options",
    "parse_overrides",
    "model_config_from_section",
    "position_length",
    "to_toml",
]
