"""Build the train/valid/test BERT datasets from Megatron-style data paths, as Megatron-Core does.

:func:`build_bert_datasets` is :func:`~epochal.data.datasets.dataset_builder.build_gpt_datasets`
with :class:`~epochal.data.datasets.bert_dataset.BERTDataset` as the per-corpus dataset:
the same blends (weighted, unweighted, per split) and the same split string, applied to
*documents* (Megatron's ``numel_low_level_dataset`` for masked datasets), and the same
index caches (``path_to_cache``; ``None`` = in memory). Megatron-LM's ``pretrain_bert.py``
defaults are the defaults here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epochal.data.datasets.bert_dataset import BERTDataset
from epochal.data.datasets.dataset_builder import (
    _Builder,
    _open_indexed,
    _sizes,
    build_from_paths,
    parse_data_paths,
)
from epochal.data.datasets.gpt_dataset import SPLIT_NAMES
from epochal.data.datasets.masked_lm import MaskingOptions, WordPieceVocabulary
from epochal.data.datasets.splits import parse_split


def _check_int(value: Any, option: str, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{option} must be an int, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{option} must be {bound}, got {value!r}")


def _check_probability(value: Any, option: str, *, open_interval: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and ((0 < value < 1) if open_interval else (0 <= value <= 1))
    if not ok:
        interval = "(0, 1)" if open_interval else "[0, 1]"
        raise ValueError(f"{option} must be a number in {interval}, got {value!r}")


@dataclass(kw_only=True)
class BERTDatasetConfig:
    """What :func:`build_bert_datasets` builds (Megatron's ``BERTMaskedWordPieceDatasetConfig``).

    Attributes:
        seq_length: tokens per sample, ``[CLS]`` and both ``[SEP]`` included (>= 5).
        seed: seed of the index shuffles and of every sample's masks
            (``0 <= seed < 2**31 - 1``: Megatron's index builder takes a C ``int``).
        tokenizer: WordPiece tokenizer with ``cls``, ``sep``, ``mask``, ``pad``,
            ``inv_vocab`` (e.g. ``build_tokenizer("BertWordPieceLowerCase", ...)``).
        data_path / split / train_data_path / valid_data_path / test_data_path: as
            :class:`~epochal.data.datasets.dataset_builder.GPTDatasetConfig`; the corpus
            must be sentence-split (``preprocess --split-sentences``).
        path_to_cache: folder for index caches; ``None`` = in memory only.
        mid_level_dataset_surplus: extra fraction per corpus of a weighted blend.
        mmap: open ``.bin`` files with mmap (else ``pread``).
        masking_probability: fraction of tokens to mask, in (0, 1).
        short_sequence_probability: probability of a shorter target length, in [0, 1].
        masking_max_ngram: longest masked N-gram (>= 1).
        masking_do_full_word: mask whole words (a piece and its ``##`` continuations).
        masking_do_permutation: also shuffle some unmasked N-grams (not with the
            geometric distribution).
        masking_use_longer_ngrams: favour longer N-grams (P ~ N instead of 1/N).
        masking_use_geometric_distribution: draw N from Geometric(0.2) (SpanBERT).
        classification_head: two segments per sample with the next-sentence label
            ``is_random`` (needs documents of >= 2 sentences).
        blend_schedule / blend_schedule_weights: the train split's blend over a
            schedule, as :class:`~epochal.data.datasets.dataset_builder.GPTDatasetConfig`.

    Raises:
        ValueError: an invalid option (the message names it).
    """

    seq_length: int
    tokenizer: Any
    seed: int = 1234
    data_path: list[str] | None = None
    split: str = "969,30,1"
    train_data_path: list[str] | None = None
    valid_data_path: list[str] | None = None
    test_data_path: list[str] | None = None
    path_to_cache: str | None = None
    mid_level_dataset_surplus: float = 0.005
    mmap: bool = True
    masking_probability: float = 0.15
    short_sequence_probability: float = 0.1
    masking_max_ngram: int = 3
    masking_do_full_word: bool = True
    masking_do_permutation: bool = False
    masking_use_longer_ngrams: bool = False
    masking_use_geometric_distribution: bool = False
    classification_head: bool = True
    blend_schedule: Any = None
    blend_schedule_weights: list[float] | None = None

    def __post_init__(self) -> None:
        _check_int(self.seq_length, "seq_length", 5)
        _check_int(self.seed, "seed", 0, 2**31 - 1)
        _check_probability(self.masking_probability, "masking_probability", open_interval=True)
        _check_probability(
            self.short_sequence_probability, "short_sequence_probability", open_interval=False
        )
        _check_int(self.masking_max_ngram, "masking_max_ngram", 1)
        for flag in (
            "masking_do_full_word",
            "masking_do_permutation",
            "masking_use_longer_ngrams",
            "masking_use_geometric_distribution",
            "classification_head",
            "mmap",
        ):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        if self.masking_use_geometric_distribution and self.masking_do_permutation:
            raise ValueError(
                "masking_do_permutation and masking_use_geometric_distribution are exclusive "
                "(as in Megatron-Core)"
            )
        if not (
            isinstance(self.mid_level_dataset_surplus, int | float)
            and math.isfinite(self.mid_level_dataset_surplus)
            and self.mid_level_dataset_surplus >= 0
        ):
            raise ValueError(
                f"mid_level_dataset_surplus must be >= 0, got {self.mid_level_dataset_surplus!r}"
            )
        if self.tokenizer is None:
            raise ValueError("tokenizer is required (a WordPiece tokenizer with [MASK])")
        WordPieceVocabulary(self.tokenizer)  # raises naming the missing attribute
        self.blend, self.blend_per_split = parse_data_paths(self)
        if self.blend is None and all(b is None for b in self.blend_per_split):
            raise ValueError(
                "data_path (or train_data_path/valid_data_path/test_data_path) is required; "
                "BERT data has no mock corpus"
            )
        if self.blend is not None:
            try:
                parse_split(self.split)
            except ValueError as err:
                raise ValueError(f"split: {err}") from None

    @property
    def masking(self) -> MaskingOptions:
        """The masking options as one object."""
        return MaskingOptions(
            probability=float(self.masking_probability),
            max_ngram=int(self.masking_max_ngram),
            do_full_word=self.masking_do_full_word,
            do_permutation=self.masking_do_permutation,
            use_longer_ngrams=self.masking_use_longer_ngrams,
            use_geometric_distribution=self.masking_use_geometric_distribution,
        )


def build_bert_datasets(
    config: BERTDatasetConfig,
    sizes: Sequence[int | None],
    *,
    open_indexed: Callable[[str], Any] | None = None,
    group: Any = None,
) -> list[Any]:
    """Return ``[train, valid, test]`` BERT datasets (``None`` for a split with no share).

    Args:
        config: the data and masking options.
        sizes: ``(train, valid, test)`` sample counts; ``None`` = one epoch of the split.
        open_indexed: opens a prefix (default: epochal's ``IndexedDataset``, mmap).
        group: ``torch.distributed`` group whose rank 0 builds the caches first.

    Returns:
        Three entries, each a :class:`BERTDataset`, a
        :class:`~epochal.data.datasets.blended_dataset.BlendedDataset` or ``None``.

    Raises:
        ValueError: invalid sizes, an empty split, or a corpus without documents of two
            sentences when ``classification_head`` is on (the message names the file).
        FileNotFoundError / OSError: a missing or unreadable ``.bin``/``.idx`` pair.
    """

    def make(
        low: Any,
        documents: np.ndarray,
        num_samples: int | None,
        split_index: int,
        seed: int | None = None,
    ) -> Any:
        return BERTDataset(
            low,
            documents,
            num_samples,
            config.seq_length,
            config.seed if seed is None else seed,
            tokenizer=config.tokenizer,
            masking=config.masking,
            short_sequence_probability=config.short_sequence_probability,
            classification_head=config.classification_head,
            split=SPLIT_NAMES[split_index],
            cache_dir=config.path_to_cache,
            group=group,
        )

    return build_masked_datasets(config, sizes, make, open_indexed=open_indexed, group=group)


def build_masked_datasets(
    config: BERTDatasetConfig,
    sizes: Sequence[int | None],
    make: Callable[[Any, np.ndarray, int | None, int], Any],
    *,
    open_indexed: Callable[[str], Any] | None = None,
    group: Any = None,
) -> list[Any]:
    """The blends and splits of Megatron's masked datasets (BERT, T5), by documents.

    Args:
        config: a :class:`BERTDatasetConfig` (or subclass).
        sizes: ``(train, valid, test)`` sample counts; ``None`` = one epoch of the split.
        make: ``(indexed, document ids, num_samples, split index, seed=None) -> dataset``
            (``seed``: another shuffle seed, for a blend schedule's extra epochs).
        open_indexed, group: as :func:`build_bert_datasets`.
    """
    sizes_list = _sizes(sizes)
    opener = open_indexed or _open_indexed(config.mmap, config.path_to_cache)
    builder = _Builder(config, sizes_list, opener, group, make=make)
    return build_from_paths(
        config, builder, lambda low: int(np.asarray(low.document_indices).shape[0]) - 1
    )
