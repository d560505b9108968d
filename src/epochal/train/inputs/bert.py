"""BERT datasets for the trainer (Megatron's path): ``epochal.data.build_bert_datasets`` from ``config.data``.

``data.corpus`` (with ``data.split_sentences`` and ``data.wordpiece_vocab_size``,
as the ``bert-tiny`` preset) is prepared first (cached; :mod:`epochal.train.inputs.corpus`):
sentence-split, a WordPiece vocabulary trained offline, tokenized. Otherwise
``data.data_path`` / ``data.{train,valid,test}_data_path`` name sentence-split
indexed files (one sequence per sentence, documents kept; ``epochal preprocess
--split-sentences``) tokenized with a WordPiece tokenizer
(``data.tokenizer_type = "BertWordPieceLowerCase"`` / ``"BertWordPieceCase"``,
``data.vocab_file``). Masking follows the ``data.masking_*`` options (Megatron's
names); ``model.bert_binary_head`` turns on Megatron's ``classification_head``
(two segments and the ``is_random`` label). Sizes as for GPT: ``train_iters *
global_batch_size`` training and ``eval_iters * global_batch_size`` validation
samples. Index caches go to ``<cache_dir>/bert-index``.

Samples carry Megatron's keys (``text``, ``types``, ``labels`` (-1 where not
predicted), ``is_random``, ``padding_mask``, ``loss_mask``, ``truncated``), which
:class:`~epochal.train.steps.BertTrainStep` reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.data.datasets.bert_builder import BERTDatasetConfig, build_bert_datasets
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.corpus import default_cache_dir, prepare_corpus, tokenizer_from_config
from epochal.train.inputs.gpt import blend_schedule_from_config

__all__ = [
    "MaskedTrainData",
    "build_bert_train_datasets",
    "build_masked_train_datasets",
    "masked_data_sources",
    "masking_options",
]

#: the ``[data]`` options that are Megatron's masking fields, passed on by name.
MASKING_OPTIONS = (
    "masking_probability",
    "short_sequence_probability",
    "masking_max_ngram",
    "masking_do_full_word",
    "masking_do_permutation",
    "masking_use_longer_ngrams",
    "masking_use_geometric_distribution",
)


def masking_options(data: Any) -> dict[str, Any]:
    """The masking fields of the ``[data]`` section, for a BERT or T5 dataset config."""
    return {name: getattr(data, name) for name in MASKING_OPTIONS}


def masked_data_sources(
    config: TrainConfig, cache: Path, *, log: Any = None
) -> tuple[dict[str, list[str] | None], Any]:
    """The data paths and the WordPiece tokenizer of a masked-data run (BERT, T5).

    ``data.corpus`` (with ``data.split_sentences``) is prepared first (cached);
    otherwise the ``data.*data_path`` files are used with ``data.tokenizer_type``.

    Returns:
        ``({"data_path": ..., "train_data_path": ..., ...}, tokenizer)``.

    Raises:
        ConfigError: no data source, or a corpus without ``data.split_sentences``.
    """
    d = config.data
    paths = {
        "data_path": d.data_path or None,
        "train_data_path": d.train_data_path or None,
        "valid_data_path": d.valid_data_path or None,
        "test_data_path": d.test_data_path or None,
    }
    if d.corpus:
        if not d.split_sentences:
            raise ConfigError(
                "data.split_sentences",
                f"must be true for model.type={config.model.type!r} on data.corpus "
                "(masked-LM samples are built from sentences)",
            )
        prepared = prepare_corpus(d, cache, log=log)
        return {"data_path": [prepared.prefix]}, prepared.tokenizer
    if not any(paths.values()):
        raise ConfigError(
            "data.data_path",
            f"model.type={config.model.type!r} trains on sentence-split indexed files "
            "(epochal preprocess --split-sentences) named by data.data_path, or on "
            "data.corpus with data.split_sentences; data.mock is GPT data",
        )
    return paths, tokenizer_from_config(d)


@dataclass(frozen=True)
class MaskedTrainData:
    """What :func:`build_masked_train_datasets` gives a masked-LM run.

    Attributes:
        train / valid: the datasets (``valid`` None when the split has none).
        tokenizer: the WordPiece tokenizer of the data.
        source: the data paths, as ``key=value`` text for the description.
        train_samples / valid_samples: the samples the run draws.
    """

    train: Any
    valid: Any | None
    tokenizer: Any
    source: str
    train_samples: int
    valid_samples: int

    def counts(self) -> str:
        """``N train samples (of M indexed in whole epochs)[, K validation]``."""
        return (
            f"{self.train_samples:,} train samples (of {len(self.train):,} indexed in whole epochs)"
            + (
                f", {min(self.valid_samples, len(self.valid)):,} validation"
                if self.valid is not None
                else ""
            )
        )


def build_masked_train_datasets(
    config: TrainConfig,
    cache_name: str,
    build: Callable[..., list[Any]],
    dataset_config: Callable[..., Any],
    *,
    check_tokenizer: Callable[[Any], None] | None = None,
    log: Any = None,
    group: Any = None,
    **fields: Any,
) -> MaskedTrainData:
    """The train and validation datasets of a masked-LM run (BERT, T5) from ``config.data``.

    Args:
        config: the run's config.
        cache_name: the index caches' folder under the cache dir (``bert-index``, ...).
        build: the data layer's builder, ``(dataset config, sizes, group=) -> [train, valid, test]``.
        dataset_config: the data layer's config class (BERT's or T5's).
        check_tokenizer: raises :class:`ConfigError` for a tokenizer the model cannot use.
        log, group: as :func:`masked_data_sources` and the builder.
        **fields: the config fields of that model only.

    Raises:
        ConfigError: no data files, an option the data layer rejects (named), or a split
            that gives the train split no documents.
    """
    d, t = config.data, config.training
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    paths, tokenizer = masked_data_sources(config, cache, log=log)
    if check_tokenizer is not None:
        check_tokenizer(tokenizer)
    train_samples = t.train_iters * t.global_batch_size
    valid_samples = t.eval_iters * t.global_batch_size
    try:
        data_config = dataset_config(
            seq_length=d.seq_length,
            seed=t.seed,
            tokenizer=tokenizer,
            split=d.split,
            path_to_cache=str(cache / cache_name),
            **masking_options(d),
            **schedule_options(config),
            **fields,
            **paths,
        )
        train, valid, _test = build(data_config, [train_samples, valid_samples, 0], group=group)
    except ValueError as exc:
        raise ConfigError("data", str(exc)) from None
    if train is None:
        raise ConfigError("data.split", f"gives the train split no documents ({d.split!r})")
    if valid is not None and len(valid) == 0:
        valid = None
    source = ", ".join(f"{k}={v}" for k, v in paths.items() if v)
    return MaskedTrainData(train, valid, tokenizer, source, train_samples, valid_samples)


def build_bert_train_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` for a BERT run.

    Raises:
        ConfigError: no data files (``data.data_path``), a corpus / mock option BERT
            cannot use, or an option the data layer rejects (named ``data.<option>``).
        FileNotFoundError / OSError: missing or unreadable indexed files (named).
    """
    data = build_masked_train_datasets(
        config,
        "bert-index",
        build_bert_datasets,
        BERTDatasetConfig,
        log=log,
        group=group,
        classification_head=config.model.bert_binary_head,
    )
    tokenizer = data.tokenizer
    description = (
        f"BERT samples of {data.source} ({type(tokenizer).__name__}, {tokenizer.vocab_size} ids); "
        f"{data.counts()}, {config.data.seq_length} tokens each"
    )
    return data.train, data.valid, tokenizer.vocab_size, tokenizer, description


def schedule_options(config: TrainConfig) -> dict[str, Any]:
    """``data.blend_schedule`` for the data layer's config (nothing without one)."""
    scheduled = blend_schedule_from_config(config)
    if scheduled is None:
        return {}
    return {"blend_schedule": scheduled[0], "blend_schedule_weights": scheduled[1]}
