"""The trainer's data pipeline, built from ``epochal.data`` (nothing re-implemented here).

``build_data(config)``:

1. tokenizer and data: ``data.corpus`` is tokenized first (cached, see
   :mod:`epochal.train.inputs.corpus`); otherwise ``data.data_path`` (Megatron-style
   prefixes / blend) with ``data.tokenizer_type``; or ``data.mock``; ESM runs read
   proteins (:mod:`epochal.train.inputs.esm`); ``sft.train_file``: chat or
   prompt-completion rows (:mod:`epochal.train.inputs.sft`);
2. train / validation datasets from the data layer's GPT dataset builder, sized as
   Megatron does (train: ``train_iters * global_batch_size`` samples; validation:
   ``eval_iters * global_batch_size``, since every evaluation reads the validation
   data from its start);
3. loaders: :class:`epochal.data.WrappedDataLoader` (mode ``train`` /
   ``validation``) transformed by :class:`epochal.data.MegatronDataSampler`
   (Megatron's ``single`` sampler, this data-parallel rank's slice of every
   global batch). Each loader has its own ``torch.Generator`` so that creating an
   iterator never draws from the global RNG (which would shift dropout after a
   resume).

The train loader's ``consumed_samples`` (in its ``state_dict``) is the only data
state a checkpoint needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from epochal.data.loading.data_sampler import MegatronDataSampler
from epochal.data.loading.loader import WrappedDataLoader
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.eval_rows import WholeTableRows

__all__ = ["DataBundle", "build_data", "make_loaders"]


@dataclass
class DataBundle:
    """Everything the trainer needs from the data layer.

    Attributes:
        train_loader: the resumable train loader (micro-batches of this rank).
        valid_loader: the validation loader (restarts every pass), or None.
        sampler: the :class:`~epochal.data.MegatronDataSampler` (batch math).
        vocab_size: the tokenizer's vocabulary size (before padding).
        tokenizer: the tokenizer, if any (None for mock data).
        description: one line saying what the data is.
        whole_validation: every evaluation reads the whole validation loader (a
            fine-tuning table, :class:`~epochal.train.inputs.eval_rows.WholeTableRows`)
            instead of ``training.eval_iters`` global batches.
        loss_tokens: ``loss_tokens(first, count) -> int``, the loss tokens of the
            global train samples ``[first, first + count)``, when the train dataset
            counts them (fine-tuning rows: the step's loss is their token mean);
            else None.
    """

    train_loader: WrappedDataLoader
    valid_loader: WrappedDataLoader | None
    sampler: MegatronDataSampler
    vocab_size: int
    tokenizer: Any = None
    description: str = ""
    whole_validation: bool = False
    loss_tokens: Any = None

    def num_microbatches_at(self, consumed_samples: int) -> int:
        """Micro-batches per step at ``consumed_samples`` (gbs / (mbs * dp))."""
        return self.sampler.num_microbatches_at(consumed_samples)


def make_loaders(
    config: TrainConfig,
    train_dataset: Any,
    valid_dataset: Any | None,
    *,
    vocab_size: int,
    tokenizer: Any = None,
    dp_rank: int = 0,
    dp_size: int = 1,
    description: str = "",
) -> DataBundle:
    """Wrap map-style datasets (items: dicts of tensors) into the trainer's loaders.

    Args:
        config: the configuration (batch sizes, seed, workers).
        train_dataset / valid_dataset: map-style datasets whose items are dicts with
            ``tokens``, ``labels`` (int64 ``[s]``) and optionally ``loss_mask``,
            ``position_ids``, ``attention_mask``.
        vocab_size: the vocabulary size the ids come from.
        tokenizer: kept for generation / logs.
        dp_rank / dp_size: this process's data-parallel rank and the data-parallel size.
        description: shown in logs.
    """
    t, d = config.training, config.data
    try:
        sampler = MegatronDataSampler(
            seq_len=d.seq_length,
            micro_batch_size=t.micro_batch_size,
            global_batch_size=t.global_batch_size,
            rampup_batch_size=t.rampup_batch_size,
            dataloader_type="single",
            data_parallel_rank=dp_rank,
            data_parallel_size=dp_size,
            seed=t.seed,
        )
    except ValueError as exc:  # the data layer's batch-size errors name the option
        raise ConfigError("training", str(exc)) from None

    def loader(dataset: Any, mode: str, offset: int) -> WrappedDataLoader:
        options: dict[str, Any] = {
            "num_workers": d.num_workers,
            "generator": torch.Generator().manual_seed(t.seed + offset),
            "pin_memory": torch.cuda.is_available(),
        }
        if d.num_workers > 0:
            options["persistent_workers"] = mode == "train"
        return sampler.transform_dataloader(WrappedDataLoader(dataset, mode=mode, **options))

    train = loader(train_dataset, "train", 0)
    valid = (
        loader(valid_dataset, "validation", 1)
        if valid_dataset is not None and len(valid_dataset)
        else None
    )
    whole = isinstance(valid_dataset, WholeTableRows)
    counter = getattr(train_dataset, "loss_tokens", None)
    return DataBundle(train, valid, sampler, vocab_size, tokenizer, description, whole, counter)


def _gpt(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.gpt import build_gpt_datasets

    return build_gpt_datasets(config, **kwargs)


def _bert(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.bert import build_bert_train_datasets

    return build_bert_train_datasets(config, **kwargs)


def _t5(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.t5 import build_t5_train_datasets

    return build_t5_train_datasets(config, **kwargs)


def _finetune(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.finetune import build_finetune_datasets

    return build_finetune_datasets(config, **kwargs)


def _sft(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.sft import build_sft_train_datasets

    return build_sft_train_datasets(config, **kwargs)


def _esm(config: TrainConfig, **kwargs: Any) -> tuple[Any, Any, int, Any, str]:
    from epochal.train.inputs.esm import build_esm_train_datasets

    return build_esm_train_datasets(config, **kwargs)


#: model type -> ``builder(config, log=, group=) -> (train, valid, vocab_size, tokenizer, description)``.
DATASET_BUILDERS: dict[str, Any] = {"gpt": _gpt, "bert": _bert, "esm": _esm, "t5": _t5}
#: Any encoder with a fine-tuning head (``model.head``) trains on labelled tables.
FINETUNE_BUILDER = _finetune


def dataset_builder(model_type: str) -> Any:
    """The dataset builder of ``model_type`` (:data:`DATASET_BUILDERS`).

    Raises:
        ConfigError: (naming ``model.type``) the type has no file-based data path.
    """
    try:
        return DATASET_BUILDERS[model_type]
    except KeyError:
        raise ConfigError(
            "model.type",
            f"{model_type!r} has no data builder from config.data (known: {sorted(DATASET_BUILDERS)}); "
            "pass datasets (e.g. MaskedTokenDataset under MultiEpochDatasetResampler) to "
            "epochal.train.inputs.loaders.make_loaders",
        ) from None


def build_data(
    config: TrainConfig, *, dp_rank: int = 0, dp_size: int = 1, log: Any = None, group: Any = None
) -> DataBundle:
    """Build tokenizer, datasets and loaders from ``config.data`` (see the module docstring).

    Args:
        config: the configuration.
        dp_rank / dp_size: this process's data-parallel rank and the data-parallel size.
        log: ``log(str)`` for progress messages (corpus preparation).
        group: ``torch.distributed`` group whose rank 0 builds the index caches first.
    """
    head = getattr(config.model, "head", "mlm")
    if config.sft.enabled:  # chat / prompt-completion rows of a GPT
        builder = _sft
    elif head != "mlm":
        builder = FINETUNE_BUILDER
    else:
        builder = dataset_builder(config.model.type)
    train_ds, valid_ds, vocab_size, tokenizer, description = builder(config, log=log, group=group)
    return make_loaders(
        config,
        train_ds,
        valid_ds,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        dp_rank=dp_rank,
        dp_size=dp_size,
        description=description,
    )
