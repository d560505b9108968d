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

Sources, later ones winning: a preset (``tiny``, ``gpt2-small``), a TOML file
(tables named like the sections), then ``--section.key=value`` overrides whose
values are TOML literals (``--model.hidden_size=256``, ``--data.data_path=["a","b"]``;
a value that is not valid TOML is taken as a string: ``--scheduler.lr_decay_style=linear``).

Every unknown key or invalid value raises :class:`~epochal.model.config.ConfigError`
naming the dotted option (``optimizer.lr``) and the allowed range.
:func:`to_toml` writes the resolved tree (the trainer stores it next to the
checkpoints); ``None`` values are omitted (every optional field defaults to None).

More sections (e.g. ``parallel``) are added by declaring another field on
:class:`TrainConfig`; the loader, the overrides and the TOML writer handle any
dataclass section.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from epochal.data.datasets.dataset_builder import parse_blend
from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.config import ParallelConfig
from epochal.train.lr_schedule import LR_DECAY_STYLES, WD_INCR_STYLES, WSD_DECAY_STYLES

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "EXCLUSIVE_OPTIONS",
    "LoggingConfig",
    "ModelSection",
    "OptimizerConfig",
    "SchedulerConfig",
    "TrainConfig",
    "TrainingConfig",
    "build_config",
    "config_from_dict",
    "config_from_saved",
    "parse_overrides",
    "position_length",
    "to_toml",
]


def _require(cond: bool, option: str, message: str) -> None:
    if not cond:
        raise ConfigError(option, message)


# ----------------------------------------------------------------------- model
def _model_section_fields() -> list[tuple[str, Any, Any]]:
    hints = typing.get_type_hints(ModelConfig)
    out = []
    for f in dataclasses.fields(ModelConfig):
        if f.name in ("vocab_size", "max_position_embeddings"):
            out.append((f.name, int | None, field(default=None)))
        else:
            out.append((f.name, hints[f.name], field(default=f.default)))
    return out


ModelSection = dataclasses.make_dataclass("ModelSection", _model_section_fields(), kw_only=True)
ModelSection.__module__ = __name__
ModelSection.__doc__ = """The ``[model]`` section: the fields of :class:`epochal.model.ModelConfig`.

``vocab_size`` defaults to the tokenizer's vocabulary size and
``max_position_embeddings`` to ``data.seq_length``; every other field has
ModelConfig's meaning and default. Validated as a whole by :class:`TrainConfig`.
"""


def model_config_from_section(section: Any, *, vocab_size: int, seq_length: int) -> ModelConfig:
    """Resolve a :class:`ModelSection` into a :class:`ModelConfig`.

    Args:
        section: the ``[model]`` section.
        vocab_size: the tokenizer's vocabulary size (used when ``model.vocab_size`` is unset).
        seq_length: ``data.seq_length`` (used when ``model.max_position_embeddings`` is unset).

    Raises:
        ConfigError: an invalid value, named ``model.<field>``.
    """
    values = dataclasses.asdict(section)
    if values["vocab_size"] is None:
        values["vocab_size"] = vocab_size
    if values["max_position_embeddings"] is None:
        values["max_position_embeddings"] = seq_length
    try:
        return ModelConfig(**values)
    except ConfigError as exc:
        raise exc.with_prefix("model") from None


def position_length(config: Any) -> int:
    """The longest sequence the model sees: ``data.seq_length``, or for T5 the longer of
    the encoder's and the decoder's (``data.seq_length_decoder``); the default
    ``model.max_position_embeddings``."""
    if getattr(config.model, "type", "gpt") == "t5":
        return max(config.data.seq_length, config.data.seq_length_decoder)
    return config.data.seq_length


# ------------------------------------------------------------------------ data
@dataclass(kw_only=True)
class DataConfig:
    """The ``[data]`` section.

    Attributes:
        data_path: Megatron-style blend: ``["prefix"]`` or
            ``["w1", "prefix1", "w2", "prefix2", ...]`` (prefixes of ``.bin``/``.idx``).
        split: Megatron's train/valid/test split of ``data_path``, e.g. ``"969,30,1"``.
        train_data_path / valid_data_path / test_data_path: a separate blend per split
            (Megatron's ``--train-data-path`` ...), instead of ``data_path`` + ``split``.
        seq_length: tokens per sample (>= 1).
        mock: train on Megatron's mock GPT corpus (no files needed; ids below
            ``model.vocab_size``, default 8192).
        corpus: if set, tokenize this corpus first (cached) and train on it:
            ``"stdlib"`` (Python's standard-library sources, a deterministic
            subset in sorted path order) or a ``.jsonl`` path.

    Exactly one data source: ``corpus``, ``mock`` or the paths. Setting two is a
    :class:`ConfigError` naming both; an option given explicitly (config file or
    override) replaces a preset's other source (see :func:`build_config`).
        corpus_max_bytes: how much of the ``stdlib`` corpus to use (bytes of source).
        json_keys: JSON keys holding the text of a JSONL corpus.
        tokenizer_type: Megatron's names: ``GPT2BPETokenizer`` (local GPT-2 files by
            default), ``HuggingFaceTokenizer``, ``TikTokenizer``, ``ByteLevelTokenizer``.
        tokenizer_model / vocab_file / merge_file: tokenizer files (Megatron's names).
        bpe_vocab_size: with ``corpus``: if > 0, train a byte-level BPE tokenizer of
            this many ids on the corpus (cached; deterministic) and use it instead of
            ``tokenizer_type`` — a small vocabulary keeps a CPU demo fast.
        cache_dir: where prepared corpora, tokenizers and index caches go
            (default ``$EPOCHAL_CACHE`` or ``~/.cache/epochal``).
        num_workers: DataLoader worker processes (0 = in the main process).
        reset_position_ids / reset_attention_mask / eod_mask_loss: Megatron's GPT
            dataset options (positions and attention restart at each document;
            no loss on end-of-document tokens).
        split_sentences: with ``corpus``: one sequence per sentence, documents kept
            (Megatron's ``--split-sentences``, :func:`epochal.data.split_sentences`),
            no end-of-document token: the corpus BERT's data needs.
        wordpiece_vocab_size: with ``corpus``: if > 0, train a WordPiece vocabulary of
            this many ids on the corpus (offline, deterministic, cached) and use
            ``BertWordPieceLowerCase`` with it instead of ``tokenizer_type``.
        masking_probability / short_sequence_probability / masking_max_ngram /
        masking_do_full_word / masking_do_permutation / masking_use_longer_ngrams /
        masking_use_geometric_distribution: Megatron's BERT masking options (BERT
            models on ``data_path``; validated by the data layer, errors name them).
            T5 uses them for its spans (Megatron's ``pretrain_t5`` uses N-grams up to
            10 from the geometric distribution: the ``t5-tiny`` preset sets that).
        seq_length_decoder: T5: decoder tokens per sample (Megatron's
            ``--decoder-seq-length``; ``seq_length`` is the encoder's).
        vocab_extra_ids: WordPiece tokenizers: append this many ``<extra_id_N>``
            sentinels (Megatron's ``--vocab-extra-ids``; T5 needs them, e.g. 100).
    """

    data_path: list[str] = field(default_factory=list)
    split: str = "969,30,1"
    train_data_path: list[str] = field(default_factory=list)
    valid_data_path: list[str] = field(default_factory=list)
    test_data_path: list[str] = field(default_factory=list)
    seq_length: int = 1024
    mock: bool = False
    corpus: str = ""
    corpus_max_bytes: int = 4_000_000
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    tokenizer_type: str = "GPT2BPETokenizer"
    tokenizer_model: str = ""
    vocab_file: str = ""
    merge_file: str = ""
    bpe_vocab_size: int = 0
    cache_dir: str = ""
    num_workers: int = 0
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    split_sentences: bool = False
    wordpiece_vocab_size: int = 0
    masking_probability: float = 0.15
    short_sequence_probability: float = 0.1
    masking_max_ngram: int = 3
    masking_do_full_word: bool = True
    masking_do_permutation: bool = False
    masking_use_longer_ngrams: bool = False
    masking_use_geometric_distribution: bool = False
    seq_length_decoder: int = 128
    vocab_extra_ids: int = 0

    def __post_init__(self) -> None:
        _require(self.seq_length >= 1, "seq_length", f"must be >= 1, got {self.seq_length}")
        _require(
            self.seq_length_decoder >= 1,
            "seq_length_decoder",
            f"must be >= 1, got {self.seq_length_decoder}",
        )
        _require(
            self.vocab_extra_ids >= 0,
            "vocab_extra_ids",
            f"must be >= 0, got {self.vocab_extra_ids}",
        )
        _require(
            self.corpus_max_bytes >= 1,
            "corpus_max_bytes",
            f"must be >= 1, got {self.corpus_max_bytes}",
        )
        _require(self.num_workers >= 0, "num_workers", f"must be >= 0, got {self.num_workers}")
        _require(
            self.wordpiece_vocab_size == 0 or 100 <= self.wordpiece_vocab_size <= 1_000_000,
            "wordpiece_vocab_size",
            f"must be 0 (off) or in [100, 1000000], got {self.wordpiece_vocab_size}",
        )
        _require(
            not (self.wordpiece_vocab_size and self.bpe_vocab_size),
            "wordpiece_vocab_size",
            "and data.bpe_vocab_size cannot both be set (one trained tokenizer)",
        )
        _require(
            self.bpe_vocab_size == 0 or 260 <= self.bpe_vocab_size <= 1_000_000,
            "bpe_vocab_size",
            f"must be 0 (off) or in [260, 1000000], got {self.bpe_vocab_size}",
        )
        _require(bool(self.json_keys), "json_keys", "must name at least one key")
        parts = self.split.replace("/", ",").split(",")
        try:
            weights = [float(p) for p in parts]
        except ValueError:
            weights = []
        _require(
            1 <= len(weights) <= 3
            and all(w >= 0 and math.isfinite(w) for w in weights)
            and sum(weights) > 0,
            "split",
            f"must be 1-3 comma-separated non-negative weights like '969,30,1', got {self.split!r}",
        )
        for name in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
            try:
                parse_blend(getattr(self, name), name)
            except ValueError as exc:
                raise ConfigError(name, str(exc).removeprefix(f"{name}: ")) from None
        per_split = self.train_data_path or self.valid_data_path or self.test_data_path
        _require(
            not (self.data_path and per_split),
            "data_path",
            "give data_path (+ split) or train/valid/test_data_path, not both",
        )
        sources = [name for name in ("corpus", "mock") if getattr(self, name)]
        if self.has_paths:
            sources.append("data_path" if self.data_path else "train_data_path")
        if len(sources) > 1:
            raise ConfigError(
                sources[0],
                f"is {getattr(self, sources[0])!r} and data.{sources[1]} is also set; set one data source "
                "(data.corpus, data.mock or data.data_path / data.train_data_path ...)",
            )

    @property
    def has_paths(self) -> bool:
        """Whether any data path (blend or per-split) is set."""
        return bool(
            self.data_path or self.train_data_path or self.valid_data_path or self.test_data_path
        )


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
        eval_iters: validation batches (of ``global_batch_size`` samples) per evaluation.
        device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
        bf16: run forward/backward under bfloat16 autocast (parameters and
            optimizer state stay float32).
        fp16: run forward/backward under float16 autocast with Megatron's loss
            scaling (:mod:`epochal.train.loss_scaler`; parameters and optimizer
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
        eval_callback: an evaluation callback ``"package.module:function"``,
            called as ``fn(batch, logits) -> {name: number} | None`` for every
            validation micro-batch (see ``Trainer.add_eval_callback``); its values
            are logged with the evaluation under ``<name>``. Empty = none.
    """

    micro_batch_size: int = 4
    global_batch_size: int = 16
    rampup_batch_size: list[int] | None = None
    train_iters: int = 300
    seed: int = 1234
    eval_interval: int = 100
    eval_iters: int = 10
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    fp16: bool = False
    loss_scale: float | None = None
    initial_loss_scale: float = 2.0**32
    min_loss_scale: float = 1.0
    loss_scale_window: int = 1000
    hysteresis: int = 2
    compile: bool = False
    exit_signal_handler: bool = True
    exit_duration_mins: float | None = None
    exit_interval: int | None = None
    train_step: str = ""
    train_step_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_callback: str = ""

    def __post_init__(self) -> None:
        _require(
            not (self.fp16 and self.bf16),
            "fp16",
            "and training.bf16 are both true; pick one precision",
        )
        _require(
            self.loss_scale is None or self.loss_scale > 0,
            "loss_scale",
            f"must be > 0 (or unset for dynamic scaling), got {self.loss_scale}",
        )
        _require(
            self.min_loss_scale > 0, "min_loss_scale", f"must be > 0, got {self.min_loss_scale}"
        )
        _require(
            self.initial_loss_scale >= self.min_loss_scale,
            "initial_loss_scale",
            f"must be >= training.min_loss_scale={self.min_loss_scale}, got {self.initial_loss_scale}",
        )
        _require(
            self.loss_scale_window >= 1,
            "loss_scale_window",
            f"must be >= 1, got {self.loss_scale_window}",
        )
        _require(self.hysteresis >= 1, "hysteresis", f"must be >= 1, got {self.hysteresis}")
        _require(
            not self.eval_callback or self.eval_callback.count(":") == 1,
            "eval_callback",
            f"must look like 'package.module:function', got {self.eval_callback!r}",
        )
        _require(
            not self.train_step or self.train_step.count(":") == 1,
            "train_step",
            f"must look like 'package.module:Class', got {self.train_step!r}",
        )
        _require(
            not self.train_step_kwargs or bool(self.train_step),
            "train_step_kwargs",
            "is set but training.train_step is not",
        )
        _require(
            self.micro_batch_size >= 1,
            "micro_batch_size",
            f"must be >= 1, got {self.micro_batch_size}",
        )
        _require(
            self.global_batch_size >= 1,
            "global_batch_size",
            f"must be >= 1, got {self.global_batch_size}",
        )
        _require(
            self.global_batch_size % self.micro_batch_size == 0,
            "global_batch_size",
            f"must be a multiple of micro_batch_size={self.micro_batch_size}, got {self.global_batch_size}",
        )
        _require(self.train_iters >= 1, "train_iters", f"must be >= 1, got {self.train_iters}")
        if self.rampup_batch_size is not None:
            r = self.rampup_batch_size
            _require(
                len(r) == 3
                and r[0] >= 1
                and r[1] >= 1
                and r[2] >= 0
                and r[0] <= self.global_batch_size,
                "rampup_batch_size",
                f"must be [start >= 1, increment >= 1, ramp_samples >= 0] with start <= "
                f"global_batch_size={self.global_batch_size}, got {r}",
            )
        _require(0 <= self.seed < 2**32, "seed", f"must be in [0, 2**32), got {self.seed}")
        _require(
            self.eval_interval >= 0, "eval_interval", f"must be >= 0, got {self.eval_interval}"
        )
        _require(self.eval_iters >= 0, "eval_iters", f"must be >= 0, got {self.eval_iters}")
        _require(
            self.exit_duration_mins is None or self.exit_duration_mins > 0,
            "exit_duration_mins",
            f"must be > 0 (or unset), got {self.exit_duration_mins}",
        )
        _require(
            self.exit_interval is None or self.exit_interval >= 1,
            "exit_interval",
            f"must be >= 1 (or unset), got {self.exit_interval}",
        )


@dataclass(kw_only=True)
class OptimizerConfig:
    """The ``[optimizer]`` section (AdamW; Megatron's argument names).

    Attributes:
        lr: peak learning rate (> 0).
        min_lr: learning rate at the end of the decay (0 <= min_lr <= lr).
        weight_decay: decoupled weight decay (>= 0); biases and norms get none.
        start_weight_decay / end_weight_decay: for an increasing weight decay
            (``scheduler.weight_decay_incr_style`` linear/cosine); default ``weight_decay``.
        adam_beta1, adam_beta2: in [0, 1).
        adam_eps: > 0.
        clip_grad: clip gradients to this global L2 norm (0 = no clipping).
    """

    lr: float = 3e-4
    min_lr: float = 0.0
    weight_decay: float = 0.01
    start_weight_decay: float | None = None
    end_weight_decay: float | None = None
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0

    def __post_init__(self) -> None:
        _require(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _require(
            0 <= self.min_lr <= self.lr,
            "min_lr",
            f"must be in [0, lr={self.lr}], got {self.min_lr}",
        )
        _require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        for name in ("start_weight_decay", "end_weight_decay"):
            v = getattr(self, name)
            _require(v is None or v >= 0, name, f"must be >= 0, got {v}")
        _require(
            self.wd_start <= self.wd_end,
            "end_weight_decay",
            f"must be >= start_weight_decay={self.wd_start}, got {self.wd_end}",
        )
        for name in ("adam_beta1", "adam_beta2"):
            v = getattr(self, name)
            _require(0 <= v < 1, name, f"must be in [0, 1), got {v}")
        _require(self.adam_eps > 0, "adam_eps", f"must be > 0, got {self.adam_eps}")
        _require(self.clip_grad >= 0, "clip_grad", f"must be >= 0 (0 = off), got {self.clip_grad}")

    @property
    def wd_start(self) -> float:
        """Weight decay at step 0."""
        return self.weight_decay if self.start_weight_decay is None else self.start_weight_decay

    @property
    def wd_end(self) -> float:
        """Weight decay at the end of the increment."""
        return self.weight_decay if self.end_weight_decay is None else self.end_weight_decay


@dataclass(kw_only=True)
class SchedulerConfig:
    """The ``[scheduler]`` section (Megatron's ``OptimizerParamScheduler``; units: optimizer steps).

    Attributes:
        lr_decay_style: ``constant``, ``linear``, ``cosine``, ``inverse-square-root`` or ``WSD``.
        lr_warmup_iters: linear warmup steps (>= 0).
        lr_warmup_fraction: if set, warmup = this fraction of ``lr_decay_iters`` (in [0, 1));
            Megatron's ``--lr-warmup-fraction``, exclusive with a non-zero ``lr_warmup_iters``.
            The presets use it, so a shortened run keeps a proportionate warmup.
        lr_warmup_init: learning rate at step 0 (in [0, optimizer.lr]).
        lr_decay_iters: steps until ``min_lr`` (default ``training.train_iters``).
        lr_wsd_decay_iters: annealing steps of ``WSD``.
        lr_wsd_decay_style: ``linear``, ``cosine``, ``exponential`` or ``minus_sqrt``.
        weight_decay_incr_style: ``constant``, ``linear`` or ``cosine`` (over ``lr_decay_iters``).
    """

    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = "cosine"
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_warmup_init: float = 0.0
    lr_decay_iters: int | None = None
    lr_wsd_decay_iters: int | None = None
    lr_wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "exponential"
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"

    def __post_init__(self) -> None:
        _require(
            self.lr_decay_style in LR_DECAY_STYLES,
            "lr_decay_style",
            f"must be one of {LR_DECAY_STYLES}, got {self.lr_decay_style!r}",
        )
        _require(
            self.lr_wsd_decay_style in WSD_DECAY_STYLES,
            "lr_wsd_decay_style",
            f"must be one of {WSD_DECAY_STYLES}, got {self.lr_wsd_decay_style!r}",
        )
        _require(
            self.weight_decay_incr_style in WD_INCR_STYLES,
            "weight_decay_incr_style",
            f"must be one of {WD_INCR_STYLES}, got {self.weight_decay_incr_style!r}",
        )
        _require(
            self.lr_warmup_iters >= 0,
            "lr_warmup_iters",
            f"must be >= 0, got {self.lr_warmup_iters}",
        )
        _require(
            self.lr_warmup_fraction is None or 0 <= self.lr_warmup_fraction < 1,
            "lr_warmup_fraction",
            f"must be in [0, 1), got {self.lr_warmup_fraction}",
        )
        _require(
            self.lr_warmup_fraction is None or self.lr_warmup_iters == 0,
            "lr_warmup_fraction",
            f"and lr_warmup_iters={self.lr_warmup_iters} are both set; set one "
            "(as Megatron's --lr-warmup-fraction / --lr-warmup-iters)",
        )
        _require(
            self.lr_warmup_init >= 0, "lr_warmup_init", f"must be >= 0, got {self.lr_warmup_init}"
        )
        _require(
            self.lr_decay_iters is None or self.lr_decay_iters >= 1,
            "lr_decay_iters",
            f"must be >= 1, got {self.lr_decay_iters}",
        )
        _require(
            self.lr_wsd_decay_iters is None or self.lr_wsd_decay_iters >= 1,
            "lr_wsd_decay_iters",
            f"must be >= 1, got {self.lr_wsd_decay_iters}",
        )


@dataclass(kw_only=True)
class CheckpointConfig:
    """The ``[checkpoint]`` section.

    Attributes:
        save_interval: save every this many steps (0 = only at the end).
        save_final: save after the last step.
        keep_last: keep this many newest checkpoints (>= 1).
        resume: ``"auto"`` (continue from ``<run_dir>/checkpoints/latest`` if it
            exists), ``"never"`` (start fresh; refuses a run_dir that has
            checkpoints), or a path to a checkpoint folder or a checkpoints folder.
        init_from: when there is nothing to resume, initialize the model weights
            from this checkpoint (a step folder, checkpoints folder or run dir,
            e.g. one written by ``epochal convert --to epochal``) and start the
            optimizer, schedule and data from zero (Megatron's ``--finetune``).
            Empty = random initialization.
    """

    save_interval: int = 100
    save_final: bool = True
    keep_last: int = 2
    resume: str = "auto"
    init_from: str = ""

    def __post_init__(self) -> None:
        _require(
            self.save_interval >= 0, "save_interval", f"must be >= 0, got {self.save_interval}"
        )
        _require(self.keep_last >= 1, "keep_last", f"must be >= 1, got {self.keep_last}")
        _require(bool(self.resume), "resume", "must be 'auto', 'never' or a checkpoint path")


@dataclass(kw_only=True)
class LoggingConfig:
    """The ``[logging]`` section.

    Attributes:
        log_interval: refresh the progress bar / TensorBoard every this many steps
            (the JSONL file gets every step).
        progress: show a tqdm progress bar.
        tensorboard: write TensorBoard events to ``<run_dir>/tensorboard`` when installed.
        wandb: also log to Weights & Biases (the ``wandb`` extra; see
            :mod:`epochal.train.wandb_logger`: offline without credentials).
        wandb_project / wandb_name: the W&B project and run name (default name: the
            run directory's name).
        wandb_dir: where W&B writes its files (default: the run directory).
        wandb_mode: ``"online"``, ``"offline"``, ``"disabled"`` or ``""`` (automatic:
            ``$WANDB_MODE``, else online with credentials, offline without).
    """

    log_interval: int = 10
    progress: bool = True
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "epochal"
    wandb_name: str = ""
    wandb_dir: str = ""
    wandb_mode: str = ""

    def __post_init__(self) -> None:
        _require(self.log_interval >= 1, "log_interval", f"must be >= 1, got {self.log_interval}")
        _require(
            self.wandb_mode in ("", "online", "offline", "disabled"),
            "wandb_mode",
            f"must be '', 'online', 'offline' or 'disabled', got {self.wandb_mode!r}",
        )


# ------------------------------------------------------------------------ root
@dataclass(kw_only=True)
class TrainConfig:
    """The whole configuration (see the module docstring for the sections)."""

    run_dir: str = "runs/tiny"
    model: ModelSection = field(
        default_factory=lambda: ModelSection(
            hidden_size=128,
            num_layers=4,  # type: ignore[misc]
            num_attention_heads=4,
        )
    )
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        _require(bool(self.run_dir), "run_dir", "must be a non-empty path")
        # Model fields, checked with placeholders for what the tokenizer decides.
        model_config_from_section(
            self.model, vocab_size=self.model.vocab_size or 1, seq_length=position_length(self)
        )
        mpe = self.model.max_position_embeddings
        longest = position_length(self)
        _require(
            mpe is None or mpe >= longest,
            "model.max_position_embeddings",
            f"must be >= data.seq_length={self.data.seq_length}"
            + (
                f" and data.seq_length_decoder={self.data.seq_length_decoder}"
                if self.model.type == "t5"
                else ""
            )
            + f", got {mpe}",
        )
        s = self.scheduler
        _require(
            s.lr_warmup_init <= self.optimizer.lr,
            "scheduler.lr_warmup_init",
            f"must be <= optimizer.lr={self.optimizer.lr}, got {s.lr_warmup_init}",
        )
        decay = self.lr_decay_iters
        warm = self.lr_warmup_iters
        if s.lr_warmup_fraction is None:
            _require(
                warm < decay,
                "scheduler.lr_warmup_iters",
                f"must be < lr_decay_iters={decay} (training.train_iters unless set), got {warm}; "
                "set a smaller scheduler.lr_warmup_iters or scheduler.lr_warmup_fraction instead "
                "(e.g. --scheduler.lr_warmup_iters=0 --scheduler.lr_warmup_fraction=0.1)",
            )
        if s.lr_decay_style == "WSD":
            _require(
                s.lr_wsd_decay_iters is not None and s.lr_wsd_decay_iters <= decay,
                "scheduler.lr_wsd_decay_iters",
                f"must be set and <= lr_decay_iters={decay} for WSD, got {s.lr_wsd_decay_iters}",
            )
        o = self.optimizer
        if s.weight_decay_incr_style == "constant":
            _require(
                o.wd_start == o.wd_end,
                "optimizer.end_weight_decay",
                "must equal start_weight_decay with scheduler.weight_decay_incr_style='constant'",
            )

    def check_data(self) -> None:
        """Require a data source (what training needs; printing a configuration does not).

        Raises:
            ConfigError: none of ``data.data_path`` (or the per-split paths),
                ``data.corpus`` or ``data.mock`` is set.
        """
        _require(
            self.data.has_paths or self.data.mock or bool(self.data.corpus),
            "data.data_path",
            "no data: set data.data_path (Megatron-style prefixes), data.corpus ('stdlib' or a "
            ".jsonl) or data.mock=true",
        )

    @property
    def lr_decay_iters(self) -> int:
        """``scheduler.lr_decay_iters`` or ``training.train_iters``."""
        return self.scheduler.lr_decay_iters or self.training.train_iters

    @property
    def lr_warmup_iters(self) -> int:
        """Warmup steps: ``lr_warmup_fraction * lr_decay_iters`` if the fraction is set, else ``lr_warmup_iters``."""
        if self.scheduler.lr_warmup_fraction is not None:
            return int(self.scheduler.lr_warmup_fraction * self.lr_decay_iters)
        return self.scheduler.lr_warmup_iters


# ----------------------------------------------------------------- loading
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, option: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, option)
            except ConfigError as exc:
                errors.append(exc.detail)
        raise ConfigError(
            option, f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}"
        )
    if origin is Literal:
        allowed = typing.get_args(tp)
        _require(value in allowed, option, f"must be one of {list(allowed)}, got {value!r}")
        return value
    if origin is dict:
        _require(isinstance(value, dict), option, f"expected a table, got {value!r}")
        return dict(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        _require(isinstance(value, list | tuple), option, f"expected a list, got {value!r}")
        return [_coerce(v, item_tp, option) for v in value]
    if dataclasses.is_dataclass(tp):
        _require(isinstance(value, dict), option, f"expected a table of options, got {value!r}")
        return _build_dataclass(tp, value, option)
    if tp is bool:
        _require(isinstance(value, bool), option, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        _require(
            isinstance(value, int) and not isinstance(value, bool),
            option,
            f"expected an integer, got {value!r}",
        )
        return value
    if tp is float:
        _require(
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
            option,
            f"expected a finite number, got {value!r}",
        )
        return float(value)
    if tp is str:
        _require(isinstance(value, str), option, f"expected a string, got {value!r}")
        return value
    return value


def _build_dataclass(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in values.items():
        option = f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise ConfigError(option, f"unknown option; known: {', '.join(sorted(known))}")
        kwargs[key] = _coerce(value, hints[key], option)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        option = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(option, f"is required (missing: {', '.join(missing)})")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise (
            exc.with_prefix(prefix) if prefix and not exc.option.startswith(prefix + ".") else exc
        ) from None


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from nested dicts (TOML tables)."""
    return _build_dataclass(TrainConfig, values, "")


def config_from_saved(values: dict[str, Any]) -> TrainConfig:
    """Build a :class:`TrainConfig` from a ``config.toml`` a run saved (any version).

    Runs saved before the options of :data:`EXCLUSIVE_OPTIONS` became exclusive may
    hold two of a group; they were resolved by precedence then, and are read the
    same way here: ``data.corpus`` over ``data.mock`` over the paths, and
    ``scheduler.lr_warmup_fraction`` over ``lr_warmup_iters``.

    Raises:
        ConfigError: as :func:`config_from_dict`.
    """
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    data, sched = values.get("data"), values.get("scheduler")
    if isinstance(data, dict) and (data.get("corpus") or data.get("mock")):
        for key in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
            data.pop(key, None)
        if data.get("corpus"):
            data.pop("mock", None)
    if isinstance(sched, dict) and sched.get("lr_warmup_fraction") is not None:
        sched["lr_warmup_iters"] = 0
    return config_from_dict(values)


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["--a.b=1", "c.d=x"]`` into ``{"a": {"b": 1}, "c": {"d": "x"}}``.

    Values are TOML literals; a value that does not parse as TOML is a string.
    Dashes in keys are read as underscores (``--training.train-iters=5``).

    Raises:
        ConfigError: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        key, sep, raw = text.partition("=")
        key = key.strip().replace("-", "_")  # --run-dir, --training.train-iters
        _require(bool(sep) and bool(key), item, "overrides look like --section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            _require(isinstance(node, dict), key, "conflicts with another override")
        node[parts[-1]] = value
    return out


# Options of which a configuration sets at most one. An option set explicitly (in the
# config file or an override) removes the preset's values of the others in its group,
# so ``--data.data_path=[...]`` replaces the tiny preset's ``data.corpus`` and
# ``--scheduler.lr_warmup_iters=5`` its ``scheduler.lr_warmup_fraction``.
EXCLUSIVE_OPTIONS: tuple[tuple[str, ...], ...] = (
    (
        "data.corpus",
        "data.mock",
        "data.data_path",
        "data.train_data_path",
        "data.valid_data_path",
        "data.test_data_path",
    ),
    ("scheduler.lr_warmup_iters", "scheduler.lr_warmup_fraction"),
)


def _has_option(values: dict[str, Any], dotted: str) -> bool:
    section, _, key = dotted.rpartition(".")
    table = values.get(section) if section else values
    return isinstance(table, dict) and key in table


def _drop_replaced_preset_options(preset: dict[str, Any], explicit: dict[str, Any]) -> None:
    for group in EXCLUSIVE_OPTIONS:
        if not any(_has_option(explicit, o) for o in group):
            continue
        for option in group:
            if _has_option(preset, option) and not _has_option(explicit, option):
                section, _, key = option.rpartition(".")
                del preset[section][key]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path),
            f"not a TOML text file (byte {exc.start} is 0x{exc.object[exc.start]:02x}, "
            "not UTF-8); --config takes a .toml file",
        ) from None
    except OSError as exc:
        raise ConfigError(
            str(path), f"cannot read the config file: {exc.strerror or exc}"
        ) from None


def build_config(
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    require_data: bool = True,
) -> TrainConfig:
    """Resolve a configuration: preset, then TOML file, then overrides.

    Options set in the file or the overrides are explicit: one of a group in
    :data:`EXCLUSIVE_OPTIONS` replaces the preset's others (an explicit
    ``data.data_path`` wins over the preset's ``data.corpus``); two set
    explicitly are an error naming both.

    Args:
        preset: a name from :data:`epochal.train.presets.PRESETS` (None = defaults).
        config_file: a TOML file.
        overrides: ``--section.key=value`` strings.
        require_data: require a data source (:meth:`TrainConfig.check_data`); False
            to resolve a configuration only to show it.

    Raises:
        ConfigError: unknown key or invalid value (names the option); a config file
            that is not UTF-8 TOML or cannot be read (names the file).
        FileNotFoundError: the config file is missing (names it).
    """
    from epochal.train.presets import preset_dict

    values: dict[str, Any] = preset_dict(preset) if preset else {}
    explicit: dict[str, Any] = {}
    if config_file is not None:
        explicit = _read_toml(Path(config_file))
    if overrides:
        explicit = _deep_merge(explicit, parse_overrides(overrides))
    _drop_replaced_preset_options(values, explicit)
    config = config_from_dict(_deep_merge(values, explicit))
    if require_data:
        config.check_data()
    return config


# ------------------------------------------------------------------ writing
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            repr(v)
            if math.isfinite(v)
            else ("inf" if v > 0 else "-inf")
            if not math.isnan(v)
            else "nan"
        )
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{" + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
        )
    raise TypeError(f"cannot write {v!r} to TOML")


def to_toml(config: TrainConfig) -> str:
    """The resolved configuration as TOML (``None`` values omitted); :func:`build_config` reads it back."""
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            tables.append((f.name, value))
        elif value is not None:
            lines.append(f"{f.name} = {_toml_value(value)}")
    for name, section in tables:
        lines.append("")
        lines.append(f"[{name}]")
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value is not None:
                lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
