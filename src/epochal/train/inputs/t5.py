"""T5 datasets for the trainer (Megatron's path): ``epochal.data.build_t5_datasets`` from ``config.data``.

As :mod:`epochal.train.inputs.bert` (the same corpus preparation, sentence-split files,
WordPiece tokenizers and masking options), with the T5 specifics:

- the tokenizer needs sentinels: ``data.vocab_extra_ids`` (Megatron's
  ``--vocab-extra-ids``, e.g. 100) appends ``<extra_id_0>`` ... to the WordPiece
  vocabulary (after its ids, so a prepared corpus is reused unchanged);
- ``data.seq_length`` is the encoder's length, ``data.seq_length_decoder`` the decoder's.

Samples carry Megatron's keys (``text_enc``, ``text_dec``, ``labels``, ``loss_mask``,
``enc_mask``, ``dec_mask``, ``truncated``), which :class:`~epochal.train.steps.T5TrainStep`
reads. Index caches go to ``<cache_dir>/t5-index``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epochal.data.datasets.t5_builder import T5DatasetConfig, build_t5_datasets
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.bert import masked_data_sources, masking_options, schedule_options
from epochal.train.inputs.corpus import default_cache_dir

__all__ = ["build_t5_train_datasets"]


def build_t5_train_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` for a T5 run.

    Raises:
        ConfigError: no data files, a tokenizer without sentinels (names
            ``data.vocab_extra_ids``), or an option the data layer rejects (named).
        FileNotFoundError / OSError: missing or unreadable indexed files (named).
    """
    d, t = config.data, config.training
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    paths, tokenizer = masked_data_sources(config, cache, log=log)
    if not getattr(tokenizer, "additional_special_tokens_ids", None):
        raise ConfigError(
            "data.vocab_extra_ids",
            f"must be > 0 for model.type='t5' (got {d.vocab_extra_ids}): T5 replaces each "
            f"masked span by a sentinel <extra_id_N>; {type(tokenizer).__name__} has none "
            "(Megatron uses --vocab-extra-ids 100)",
        )
    train_samples = t.train_iters * t.global_batch_size
    valid_samples = t.eval_iters * t.global_batch_size
    try:
        tcfg = T5DatasetConfig(
            seq_length=d.seq_length,
            seq_length_decoder=d.seq_length_decoder,
            seed=t.seed,
            tokenizer=tokenizer,
            split=d.split,
            path_to_cache=str(cache / "t5-index"),
            **masking_options(d),
            **schedule_options(config),
            **paths,
        )
        train, valid, _test = build_t5_datasets(
            tcfg, [train_samples, valid_samples, 0], group=group
        )
    except ValueError as exc:
        raise ConfigError("data", str(exc)) from None
    if train is None:
        raise ConfigError("data.split", f"gives the train split no documents ({d.split!r})")
    if valid is not None and len(valid) == 0:
        valid = None
    source = ", ".join(f"{k}={v}" for k, v in paths.items() if v)
    description = (
        f"T5 span-corruption samples of {source} ({type(tokenizer).__name__}, "
        f"{tokenizer.vocab_size} ids, {len(tokenizer.additional_special_tokens_ids)} sentinels); "
        f"{train_samples:,} train samples (of {len(train):,} indexed in whole epochs)"
        + (f", {min(valid_samples, len(valid)):,} validation" if valid is not None else "")
        + f", {d.seq_length} encoder / {d.seq_length_decoder} decoder tokens"
    )
    return train, valid, tokenizer.vocab_size, tokenizer, description
