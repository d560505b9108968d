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

from typing import Any

from epochal.data.datasets.t5_builder import T5DatasetConfig, build_t5_datasets
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.bert import build_masked_train_datasets

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
    d = config.data

    def check_sentinels(tokenizer: Any) -> None:
        if not getattr(tokenizer, "additional_special_tokens_ids", None):
            raise ConfigError(
                "data.vocab_extra_ids",
                f"must be > 0 for model.type='t5' (got {d.vocab_extra_ids}): T5 replaces each "
                f"masked span by a sentinel <extra_id_N>; {type(tokenizer).__name__} has none "
                "(Megatron uses --vocab-extra-ids 100)",
            )

    data = build_masked_train_datasets(
        config,
        "t5-index",
        build_t5_datasets,
        T5DatasetConfig,
        check_tokenizer=check_sentinels,
        log=log,
        group=group,
        seq_length_decoder=d.seq_length_decoder,
    )
    tokenizer = data.tokenizer
    description = (
        f"T5 span-corruption samples of {data.source} ({type(tokenizer).__name__}, "
        f"{tokenizer.vocab_size} ids, {len(tokenizer.additional_special_tokens_ids)} sentinels); "
        f"{data.counts()}, {d.seq_length} encoder / {d.seq_length_decoder} decoder tokens"
    )
    return data.train, data.valid, tokenizer.vocab_size, tokenizer, description
