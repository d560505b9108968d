"""Build the train/valid/test T5 datasets from Megatron-style data paths, as Megatron-Core does.

:func:`build_t5_datasets` is :func:`~epochal.data.datasets.bert_builder.build_bert_datasets`
with :class:`~epochal.data.datasets.t5_dataset.T5Dataset` per corpus: the same blends,
split string (by documents) and index caches. The defaults are Megatron-LM's
``pretrain_t5.py``: N-grams up to 10 tokens drawn from the geometric distribution,
whole words, 15% of the tokens masked, decoder length 128.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epochal.data.datasets.bert_builder import (
    BERTDatasetConfig,
    _check_int,
    build_masked_datasets,
)
from epochal.data.datasets.gpt_dataset import SPLIT_NAMES
from epochal.data.datasets.t5_dataset import T5Dataset, check_decoder_length, sentinel_ids

__all__ = ["T5DatasetConfig", "build_t5_datasets"]


@dataclass(kw_only=True)
class T5DatasetConfig(BERTDatasetConfig):
    """What :func:`build_t5_datasets` builds (Megatron's ``T5MaskedWordPieceDatasetConfig``).

    Every field of :class:`~epochal.data.datasets.bert_builder.BERTDatasetConfig`
    (``seq_length`` is the encoder's length, Megatron's ``sequence_length`` /
    ``sequence_length_encoder``), plus:

    Attributes:
        seq_length_decoder: decoder tokens per sample (Megatron's
            ``sequence_length_decoder``, ``--decoder-seq-length``; default 128).

    The tokenizer must have sentinels (``additional_special_tokens_ids``, e.g. a
    WordPiece tokenizer with ``vocab_extra_ids=100``) and ``bos``/``eos``.
    ``classification_head`` must stay false (T5 samples have one segment).

    Raises:
        ValueError: an invalid option (named), a tokenizer without sentinels, or a
            ``seq_length_decoder`` too short for the masked tokens of a full sample.
    """

    seq_length_decoder: int = 128
    masking_max_ngram: int = 10
    masking_use_geometric_distribution: bool = True
    classification_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.classification_head:
            raise ValueError("classification_head must be false for T5 (one segment per sample)")
        _check_int(self.seq_length_decoder, "seq_length_decoder", 1)
        sentinel_ids(self.tokenizer)  # raises naming what is missing
        check_decoder_length(self.seq_length, self.seq_length_decoder, self.masking_probability)


def build_t5_datasets(
    config: T5DatasetConfig,
    sizes: Sequence[int | None],
    *,
    open_indexed: Callable[[str], Any] | None = None,
    group: Any = None,
) -> list[Any]:
    """Return ``[train, valid, test]`` T5 datasets (``None`` for a split with no share).

    Args:
        config: the data and masking options.
        sizes: ``(train, valid, test)`` sample counts; ``None`` = one epoch of the split.
        open_indexed: opens a prefix (default: epochal's ``IndexedDataset``, mmap).
        group: ``torch.distributed`` group whose rank 0 builds the caches first.

    Returns:
        Three entries, each a :class:`~epochal.data.datasets.t5_dataset.T5Dataset`, a
        :class:`~epochal.data.datasets.blended_dataset.BlendedDataset` or ``None``.

    Raises:
        ValueError: invalid sizes or an empty split (the message names the file).
        FileNotFoundError / OSError: a missing or unreadable ``.bin``/``.idx`` pair.
    """

    def make(
        low: Any,
        documents: np.ndarray,
        num_samples: int | None,
        split_index: int,
        seed: int | None = None,
    ) -> Any:
        return T5Dataset(
            low,
            documents,
            num_samples,
            config.seq_length,
            config.seq_length_decoder,
            config.seed if seed is None else seed,
            tokenizer=config.tokenizer,
            masking=config.masking,
            short_sequence_probability=config.short_sequence_probability,
            split=SPLIT_NAMES[split_index],
            cache_dir=config.path_to_cache,
            group=group,
        )

    return build_masked_datasets(config, sizes, make, open_indexed=open_indexed, group=group)
