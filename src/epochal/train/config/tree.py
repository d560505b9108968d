"""The whole configuration tree, :class:`TrainConfig`, and its cross-section checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from epochal._checks import require
from epochal.parallel.config import ParallelConfig
from epochal.train.config.checkpoint import CheckpointConfig
from epochal.train.config.data import DataConfig
from epochal.train.config.finetune import FinetuneConfig
from epochal.train.config.log import LoggingConfig
from epochal.train.config.model import ModelSection, model_config_from_section, position_length
from epochal.train.config.optimizer import OptimizerConfig
from epochal.train.config.scheduler import SchedulerConfig
from epochal.train.config.sft import SFTConfig
from epochal.train.config.training import TrainingConfig

__all__ = [
    "TrainConfig",
]


# ------------------------------------------------------------------------ root
@dataclass(kw_only=True)
class TrainConfig:
    """The whole configuration (see the module docstring for the sections).

    Attributes:
        run_dir: where the run's checkpoints, metrics, plots and resolved configuration
            go; a run started again with it resumes. Unset in the file and on the
            command line, ``build_config`` names it after the run: ``runs/<preset>`` or
            ``runs/<config file name>``, with ``-<hash>`` of the run-defining options that
            overrides change (:mod:`epochal.train.config.run_name`).
    """

    run_dir: str = "runs/default"
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
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        require(bool(self.run_dir), "run_dir", "must be a non-empty path")
        # Model fields, checked with placeholders for what the tokenizer decides.
        model_config = model_config_from_section(
            self.model, vocab_size=self.model.vocab_size or 1, seq_length=position_length(self)
        )
        if self.sft.enabled:
            self._check_sft(model_config.type)
        if self.data.pack_sequences:
            require(
                model_config.is_encoder,
                "data.pack_sequences",
                "packs masked-LM samples of encoders (model.type 'bert' or 'esm'), "
                f"not model.type={model_config.type!r}",
            )
            require(
                self.parallel.pipeline_parallel == 1,
                "data.pack_sequences",
                "is not supported with pipeline parallelism (packed micro-batches differ "
                "in length, a pipeline schedule needs one shape); set "
                f"parallel.pipeline_parallel=1, got {self.parallel.pipeline_parallel}",
            )
            pooled = "model.bert_binary_head" if model_config.bert_binary_head else None
            if model_config.head != "mlm":
                pooled = f"model.head={model_config.head!r}"
            require(
                pooled is None or self.parallel.context_parallel == 1,
                "data.pack_sequences",
                f"with {pooled} is not supported under context parallelism (the head reads "
                "each packed sequence whole, which the ranks' chunks of the row do not "
                "keep); set data.pack_sequences=false or "
                f"parallel.context_parallel=1, got {self.parallel.context_parallel}",
            )
            require(
                not (
                    self.model.head == "residue_classification"
                    and model_config.residue_head == "conv"
                ),
                "data.pack_sequences",
                "cannot pack for model.head='residue_classification' with "
                "model.residue_head='conv': the convolutional head also reads the padding "
                "after each protein, which packing removes (its predictions would differ); "
                "set model.residue_head='linear' or data.pack_sequences=false",
            )
        profile = self.logging.profile_steps
        require(
            profile is None or profile[0] <= self.training.train_iters,
            "logging.profile_steps",
            f"starts after the run's last step (training.train_iters={self.training.train_iters}), "
            f"got {profile}: nothing would be profiled; choose steps in [1, {self.training.train_iters}]",
        )
        mpe = self.model.max_position_embeddings
        longest = position_length(self)
        require(
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
        require(
            s.lr_warmup_init <= self.optimizer.lr,
            "scheduler.lr_warmup_init",
            f"must be <= optimizer.lr={self.optimizer.lr}, got {s.lr_warmup_init}",
        )
        decay = self.lr_decay_iters
        warm = self.lr_warmup_iters
        if s.lr_warmup_fraction is None:
            require(
                warm < decay,
                "scheduler.lr_warmup_iters",
                f"must be < lr_decay_iters={decay} (training.train_iters unless set), got {warm}; "
                "set a smaller scheduler.lr_warmup_iters or scheduler.lr_warmup_fraction instead "
                "(e.g. --scheduler.lr_warmup_iters=0 --scheduler.lr_warmup_fraction=0.1)",
            )
        if s.lr_decay_style == "WSD":
            require(
                s.lr_wsd_decay_iters is not None and s.lr_wsd_decay_iters <= decay,
                "scheduler.lr_wsd_decay_iters",
                f"must be set and <= lr_decay_iters={decay} for WSD, got {s.lr_wsd_decay_iters}",
            )
        o = self.optimizer
        if s.weight_decay_incr_style == "constant":
            require(
                o.wd_start == o.wd_end,
                "optimizer.end_weight_decay",
                "must equal start_weight_decay with scheduler.weight_decay_incr_style='constant'",
            )

    def _check_sft(self, model_type: str) -> None:
        """``sft.train_file`` against the options it cannot go with (each named)."""
        require(
            model_type == "gpt",
            "sft.train_file",
            f"fine-tunes a GPT (model.type='gpt') on chat or prompt-completion rows, "
            f"not model.type={model_type!r}",
        )
        require(
            self.model.head == "mlm",
            "sft.train_file",
            f"trains the language-model head; model.head={self.model.head!r} fine-tunes on "
            "a labelled table (finetune.train_file): set one of them",
        )
        d = self.data
        sources = [name for name in ("corpus", "mock", "protein_path") if getattr(d, name)]
        if d.has_paths:
            sources.append("data_path" if d.data_path else "train_data_path")
        if d.train_cluster_path:
            sources.append("train_cluster_path")
        require(
            not sources,
            "sft.train_file",
            f"is the run's data, and data.{sources[0] if sources else ''} is also set; "
            "set one data source",
        )
        for name, why in (
            ("pack_sequences", "packs masked-LM samples of encoders; use sft.packing"),
            ("reset_position_ids", "is for pretraining corpora; sft.packing restarts them per row"),
            ("reset_attention_mask", "is for pretraining corpora; sft.packing confines attention"),
            ("eod_mask_loss", "is for pretraining corpora; sft.loss_on chooses the loss tokens"),
            ("blend_schedule", "is for pretraining blends"),
        ):
            require(
                not getattr(d, name),
                f"data.{name}",
                f"{why}; it cannot be set with sft.train_file",
            )

    @property
    def per_document_positions(self) -> bool:
        """Samples carry ``position_ids`` restarting per document or row (the model gets them)."""
        return self.data.reset_position_ids or (self.sft.enabled and self.sft.packing)

    @property
    def per_document_attention(self) -> bool:
        """Samples carry a bool ``attention_mask`` confining attention to each document or row."""
        return self.data.reset_attention_mask or (self.sft.enabled and self.sft.packing)

    def check_data(self) -> None:
        """Require a data source (what training needs; printing a configuration does not).

        Raises:
            ConfigError: none of ``data.data_path`` (or the per-split paths),
                ``data.corpus``, ``data.mock`` or a protein source is set.
        """
        require(
            self.model.head not in ("pooled_classifier", "token_classifier"),
            "model.head",
            f"{self.model.head!r} is the head of a transformers classifier given to "
            "epochal.accelerate's prepare(); to fine-tune on a labelled table use "
            "'sequence_classification', 'sequence_regression' or 'residue_classification'",
        )
        if self.sft.enabled:
            return
        if self.model.head != "mlm":
            require(
                bool(self.finetune.train_file),
                "finetune.train_file",
                f"model.head={self.model.head!r} fine-tunes on a labelled table: set finetune.train_file",
            )
            return
        d = self.data
        require(
            d.has_paths or d.mock or bool(d.corpus) or d.has_proteins,
            "data.data_path",
            "no data: set data.data_path (Megatron-style prefixes), data.corpus ('stdlib' or a "
            ".jsonl or .txt), data.mock=true, or for ESM data.protein_path / data.train_cluster_path",
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
