"""Build the train/valid/test GPT datasets from Megatron-style data paths, as Megatron-Core does.

:func:`build_gpt_datasets` follows ``BlendedMegatronDatasetBuilder`` case by case, so
each split holds the same samples as Megatron-Core's for the same arguments:

- ``data_path=["prefix"]``: one :class:`~epochal.data.gpt_dataset.GPTDataset` per
  split over that split's document range (see :mod:`epochal.data.datasets.splits`), with
  ``sizes[i]`` samples (``None`` = one epoch).
- ``data_path=["0.3", "a", "0.7", "b"]``: per split, one ``GPTDataset`` per corpus with
  ``ceil(ceil(size * w) * (1 + mid_level_dataset_surplus))`` samples (a small margin),
  blended by a :class:`~epochal.data.blended_dataset.BlendedDataset` of
  ``sum(ceil(size * w))`` samples (marginally more than ``size``).
- ``data_path=["a", "b"]`` (no weights): one epoch of each corpus, blended in
  proportion to their lengths, ``min(size, total)`` samples (all of them for ``None``).
- ``train_data_path`` / ``valid_data_path`` / ``test_data_path``: a separate blend per
  split, each using its whole corpora (Megatron's ``blend_per_split``).
- ``mock=True``: Megatron's mock corpus (:mod:`epochal.data.datasets.mock_gpt`) split ``"1,1,1"``
  (Megatron-Core ignores the split string for mock data, and so do we).

A split whose document range is empty raises ``ValueError`` (Megatron-Core hangs),
unless 0 samples are requested from it: then it is ``None``. Validation samples
keep a padded last partial window when
``drop_last_partial_validation_sequence=False``. Index caches go to ``path_to_cache``
(``None``: built in memory, nothing written; unlike Megatron-Core, which writes a
``cache`` folder next to the data by default). Every rank of a distributed job must
call the builder (rank 0 builds the caches first, see :mod:`epochal.data.datasets.index_cache`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epochal.data.datasets.blended_dataset import BlendedDataset, normalize_weights
from epochal.data.datasets.gpt_dataset import SPLIT_NAMES, GPTDataset
from epochal.data.datasets.mock_gpt import MockGPTLowLevelDataset
from epochal.data.datasets.scheduled_blend import ScheduledBlendedDataset
from epochal.data.datasets.source_epochs import SourceEpochs, epoch_seed
from epochal.data.datasets.splits import parse_split, split_document_ranges, split_matrix


def parse_blend(
    paths: Sequence[str] | str | None, option: str = "data_path"
) -> tuple[list[str], list[float] | None] | None:
    """Parse Megatron's ``--data-path`` list into ``(prefixes, weights or None)``.

    ``["prefix"]`` or ``["a", "b"]`` have no weights; ``["0.3", "a", "0.7", "b"]``
    alternates weight and prefix. A single string is split on whitespace.

    Raises:
        ValueError: an empty entry, a blend where only some weights are numbers, or a
            negative/non-finite weight (the message names ``option``).
    """
    if paths is None:
        return None
    items = paths.split() if isinstance(paths, str) else [str(p) for p in paths]
    items = [p.strip() for p in items]
    if not items:
        return None
    if any(not p for p in items):
        raise ValueError(f"{option}: empty entry in {list(paths)!r}")
    if len(items) % 2 == 1:
        return items, None
    raw_weights, prefixes = items[0::2], items[1::2]
    weights: list[float | None] = []
    for raw in raw_weights:
        try:
            weights.append(float(raw))
        except ValueError:
            weights.append(None)
    if all(w is None for w in weights):
        return items, None
    if any(w is None for w in weights):
        raise ValueError(
            f"{option}: a blend must alternate weight and prefix ('w1 p1 w2 p2 ...'), got {items}"
        )
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(
            f"{option}: blend weights must be finite, >= 0 and not all 0, got {raw_weights}"
        )
    return prefixes, [float(w) for w in weights]


def parse_data_paths(
    config: Any,
) -> tuple[tuple[list[str], list[float] | None] | None, list[Any]]:
    """Parse a config's ``data_path`` and ``train/valid/test_data_path`` blends.

    Args:
        config: has ``data_path``, ``train_data_path``, ``valid_data_path``, ``test_data_path``.

    Returns:
        ``(blend, blend_per_split)``: :func:`parse_blend` of ``data_path`` and of each split's path.

    Raises:
        ValueError: a bad blend, or both ``data_path`` and a per-split path (named).
    """
    blend = parse_blend(config.data_path, "data_path")
    blend_per_split = [
        parse_blend(paths, f"{name}_data_path")
        for name, paths in zip(
            SPLIT_NAMES, (config.train_data_path, config.valid_data_path, config.test_data_path)
        )
    ]
    if blend is not None and any(b is not None for b in blend_per_split):
        raise ValueError(
            "data_path and train/valid/test_data_path are exclusive; give one or the other"
        )
    return blend, blend_per_split


@dataclass(kw_only=True)
class GPTDatasetConfig:
    """What :func:`build_gpt_datasets` builds (Megatron's ``GPTDatasetConfig`` and data args).

    Attributes:
        seq_length: tokens per sample (>= 1).
        seed: seed of every dataset's shuffles (Megatron's ``--seed``; ``0 <= seed < 2**32``).
        data_path: Megatron's ``--data-path`` blend (see :func:`parse_blend`).
        split: Megatron's ``--split``, e.g. ``"969,30,1"`` (with ``data_path``).
        train_data_path / valid_data_path / test_data_path: a separate blend per split
            (instead of ``data_path``/``split``).
        mock: use the mock corpus (also when no path is given at all).
        vocab_size: vocabulary size, needed for ``mock``.
        path_to_cache: folder for index caches; ``None`` = in memory only.
        add_extra_token_to_sequence / reset_position_ids / reset_attention_mask /
            eod_mask_loss / create_attention_mask / eod_token_id / pad_token_id: passed to
            every :class:`~epochal.data.gpt_dataset.GPTDataset`.
        drop_last_partial_validation_sequence: ``False`` keeps a padded last partial
            window in the validation split.
        mid_level_dataset_surplus: extra fraction of samples built per corpus of a
            weighted blend (Megatron: 0.005).
        mmap: open ``.bin`` files with mmap (else ``pread``, "lazy" mode).
        blend_schedule: the train split's blend shares over global sample numbers
            (:class:`~epochal.data.datasets.blend_schedule.BlendSchedule`, one weight per
            prefix of ``data_path`` / ``train_data_path``): the train split is then a
            :class:`~epochal.data.datasets.scheduled_blend.ScheduledBlendedDataset` whose
            sources are the datasets a run without the schedule builds (Megatron's sizes;
            a constant schedule: its weights' sizes), grown by whole extra epochs where
            the schedule needs more (:mod:`~epochal.data.datasets.source_epochs`);
            validation and test keep the paths' blend.
        blend_schedule_weights: with a constant schedule, its weights as written
            (Megatron normalizes them in float64; default the schedule's shares).

    Raises:
        ValueError: an invalid option (the message names it).
    """

    seq_length: int
    seed: int = 1234
    data_path: list[str] | None = None
    split: str = "969,30,1"
    train_data_path: list[str] | None = None
    valid_data_path: list[str] | None = None
    test_data_path: list[str] | None = None
    mock: bool = False
    vocab_size: int | None = None
    path_to_cache: str | None = None
    add_extra_token_to_sequence: bool = True
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    create_attention_mask: bool = False
    eod_token_id: int | None = None
    pad_token_id: int | None = None
    drop_last_partial_validation_sequence: bool = True
    mid_level_dataset_surplus: float = 0.005
    mmap: bool = True
    blend_schedule: Any = None
    blend_schedule_weights: list[float] | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.seq_length, bool)
            or not isinstance(self.seq_length, int)
            or self.seq_length < 1
        ):
            raise ValueError(f"seq_length must be an int >= 1, got {self.seq_length!r}")
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not 0 <= self.seed < 2**32
        ):
            raise ValueError(f"seed must be an int in [0, 2**32), got {self.seed!r}")
        if not (
            isinstance(self.mid_level_dataset_surplus, int | float)
            and math.isfinite(self.mid_level_dataset_surplus)
            and self.mid_level_dataset_surplus >= 0
        ):
            raise ValueError(
                f"mid_level_dataset_surplus must be >= 0, got {self.mid_level_dataset_surplus!r}"
            )
        self.blend, self.blend_per_split = parse_data_paths(self)
        per_split = any(b is not None for b in self.blend_per_split)
        if self.blend is None and not per_split:
            self.mock = True
        if self.mock and (self.blend is not None or per_split):
            raise ValueError(
                "mock=True cannot be combined with data_path or train/valid/test_data_path"
            )
        if self.blend is not None:
            try:
                parse_split(self.split)
            except ValueError as err:
                raise ValueError(f"split: {err}") from None
        if self.mock:
            if self.vocab_size is None or self.vocab_size < 2:
                raise ValueError(f"vocab_size must be >= 2 for mock data, got {self.vocab_size!r}")
            if self.eod_token_id is None:
                raise ValueError("eod_token_id is needed for mock data")


def _sizes(sizes: Sequence[int | None]) -> list[int | None]:
    sizes = list(sizes)
    if len(sizes) != 3:
        raise ValueError(
            f"sizes must give (train, valid, test) sample counts, got {len(sizes)} values"
        )
    for name, size in zip(SPLIT_NAMES, sizes):
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0
        ):
            raise ValueError(
                f"sizes: the {name} sample count must be an int >= 0 or None, got {size!r}"
            )
    return [None if s is None else int(s) for s in sizes]


def _size_per_dataset(weights: list[float], size: int, surplus: float = 0.0) -> list[int]:
    """Megatron's ``_get_size_per_split_per_dataset`` for one split."""
    return [int(math.ceil(math.ceil(size * w) * (1 + surplus))) for w in weights]


class _Builder:
    def __init__(
        self,
        config: Any,
        sizes: list[int | None],
        open_indexed: Callable[[str], Any],
        group: Any,
        make: Callable[..., Any] | None = None,
    ) -> None:
        self.config = config
        self.make = make or self.gpt
        self.sizes = sizes
        self.open_indexed = open_indexed
        self.group = group
        self._opened: dict[str, Any] = {}

    def gpt(
        self,
        low: Any,
        documents: np.ndarray,
        num_samples: int | None,
        split_index: int,
        seed: int | None = None,
    ) -> GPTDataset:
        c = self.config
        split = SPLIT_NAMES[split_index]
        return GPTDataset(
            low,
            documents,
            num_samples,
            c.seq_length,
            c.seed if seed is None else seed,
            split=split,
            add_extra_token_to_sequence=c.add_extra_token_to_sequence,
            drop_last_partial_sequence=c.drop_last_partial_validation_sequence
            if split == "valid"
            else True,
            reset_position_ids=c.reset_position_ids,
            reset_attention_mask=c.reset_attention_mask,
            eod_mask_loss=c.eod_mask_loss,
            create_attention_mask=c.create_attention_mask,
            eod_token_id=c.eod_token_id,
            pad_token_id=c.pad_token_id,
            cache_dir=c.path_to_cache,
            group=self.group,
        )

    def low_level(self, prefix: str) -> Any:
        if prefix not in self._opened:
            self._opened[prefix] = self.open_indexed(prefix)
        return self._opened[prefix]

    def splits_of(
        self, low: Any, ranges: list[tuple[int, int] | None], sizes: list[int | None]
    ) -> list[GPTDataset | None]:
        out: list[GPTDataset | None] = []
        for i, bounds in enumerate(ranges):
            if bounds is None or (bounds[0] == bounds[1] and self.sizes[i] == 0):
                # an empty split that no sample is asked from is absent, not an error
                out.append(None)
            else:
                documents = np.arange(bounds[0], bounds[1], dtype=np.int32)
                out.append(self.make(low, documents, sizes[i], i))
        return out

    def blend(
        self,
        prefixes: list[str],
        weights: list[float] | None,
        ranges_of: Callable[[Any], list[tuple[int, int] | None]],
        sizes: list[int | None],
        present: list[bool],
        single_ignores_weight: bool = False,
    ) -> list[Any]:
        lows = [self.low_level(p) for p in prefixes]
        schedule = getattr(self.config, "blend_schedule", None) if present[0] else None
        if schedule is not None:
            if schedule.sources != len(prefixes):
                raise ValueError(
                    f"blend_schedule has {schedule.sources} weights per point but the train "
                    f"blend has {len(prefixes)} prefixes"
                )
            return self.scheduled(prefixes, weights, ranges_of, sizes, present, schedule)
        if len(prefixes) == 1 and (weights is None or single_ignores_weight):
            return self.splits_of(lows[0], ranges_of(lows[0]), sizes)
        if weights is not None:
            weights = normalize_weights(weights)
            for i, name in enumerate(SPLIT_NAMES):
                if present[i] and sizes[i] is None:
                    raise ValueError(
                        f"a weighted blend needs a sample count for the {name} split, got None"
                    )
            target = [_size_per_dataset(weights, s or 0) for s in sizes]  # [split][dataset]
            buffer = [
                _size_per_dataset(weights, s or 0, self.config.mid_level_dataset_surplus)
                for s in sizes
            ]
            per_corpus = [
                self.splits_of(low, ranges_of(low), [buffer[i][j] for i in range(3)])
                for j, low in enumerate(lows)
            ]
        else:
            per_corpus = [self.splits_of(low, ranges_of(low), [None, None, None]) for low in lows]
        out: list[Any] = [None, None, None]
        for i in range(3):
            if not present[i]:
                continue
            datasets = [per_corpus[j][i] for j in range(len(lows))]
            if any(d is None for d in datasets):  # an empty split with 0 samples requested
                continue
            if weights is not None:
                blend_weights: list[float] = weights
                size: int | None = sum(target[i])
            else:
                blend_weights = [len(d) for d in datasets]
                size = None if sizes[i] is None else min(sizes[i], sum(blend_weights))
            out[i] = BlendedDataset(
                datasets,
                blend_weights,
                size,
                split=SPLIT_NAMES[i],
                cache_dir=self.config.path_to_cache,
                group=self.group,
            )
        return out

    def scheduled(
        self,
        prefixes: list[str],
        weights: list[float] | None,
        ranges_of: Callable[[Any], list[tuple[int, int] | None]],
        sizes: list[int | None],
        present: list[bool],
        schedule: Any,
    ) -> list[Any]:
        """The splits with a :class:`ScheduledBlendedDataset` train split (the others as usual)."""
        if sizes[0] is None:
            raise ValueError("a blend schedule needs a sample count for the train split, got None")
        raw = getattr(self.config, "blend_schedule_weights", None)
        surplus = self.config.mid_level_dataset_surplus
        if schedule.is_constant():  # Megatron's sizes for the schedule's weights
            w = raw or [float(x) for x in schedule.shares[0]]
            base = _size_per_dataset(normalize_weights(w), sizes[0], surplus)
        elif weights is not None:  # the sources a run without the schedule builds
            base = _size_per_dataset(normalize_weights(weights), sizes[0], surplus)
        else:
            base = [None] * len(prefixes)
        rest: list[Any] = [None, None, None]
        if any(present[1:]):  # validation and test: the paths' own blend, without the train split
            rest = self.blend(
                prefixes,
                weights,
                lambda low: [None, *ranges_of(low)[1:]],
                [0, sizes[1], sizes[2]],
                [False, *present[1:]],
            )
        datasets = []
        for j, prefix in enumerate(prefixes):
            low = self.low_level(prefix)
            train_range = ranges_of(low)[0]
            first = self.splits_of(low, [train_range, None, None], [base[j], 0, 0])[0]
            if first is None or train_range is None:
                raise ValueError(f"blend_schedule: {prefix} has no documents in the train split")
            documents = np.arange(train_range[0], train_range[1], dtype=np.int32)

            def make_epoch(e: int, low: Any = low, documents: np.ndarray = documents) -> Any:
                return self.make(low, documents, None, 0, seed=epoch_seed(self.config.seed, e))

            datasets.append(SourceEpochs(first, make_epoch, str(getattr(first, "name", prefix))))
        rest[0] = ScheduledBlendedDataset(
            datasets,
            schedule,
            sizes[0],
            weights=raw,
            split=SPLIT_NAMES[0],
            cache_dir=self.config.path_to_cache,
            group=self.group,
            past_weights=weights,
        )
        return rest


def _open_indexed(mmap: bool, cache_dir: str | None) -> Callable[[str], Any]:
    def open_prefix(prefix: str) -> Any:
        from epochal.data.indexed.indexed_dataset import IndexedDataset

        # fully validated: a corrupt corpus must stop training, not feed it wrong tokens;
        # the pass is remembered per file identity in the index cache
        return IndexedDataset(
            prefix, mode="mmap" if mmap else "lazy", validate=True, validation_cache=cache_dir
        )

    return open_prefix


def build_gpt_datasets(
    config: GPTDatasetConfig,
    sizes: Sequence[int | None],
    *,
    open_indexed: Callable[[str], Any] | None = None,
    group: Any = None,
) -> list[Any]:
    """Return ``[train, valid, test]`` datasets (``None`` for a split with no share).

    Args:
        config: the data options.
        sizes: ``(train, valid, test)`` sample counts; ``None`` = one epoch of the split.
            In a weighted blend every present split needs a count.
        open_indexed: opens a prefix as an indexed dataset (default: epochal's
            :class:`~epochal.data.indexed.indexed_dataset.IndexedDataset`, mmap, fully
            validated, the pass remembered per file identity in ``path_to_cache``); any
            object with Megatron's interface works.
        group: ``torch.distributed`` group whose rank 0 builds the caches first.

    Returns:
        Three entries, each a :class:`GPTDataset`, a :class:`BlendedDataset` or ``None``.

    Raises:
        ValueError: invalid sizes, or a present split with no documents or tokens (the
            message names the split and the corpus size).
        FileNotFoundError / OSError: a missing or unreadable ``.bin``/``.idx`` pair.
        IndexedFileError (a ValueError): a corrupt pair (the message names the file).
    """
    sizes_list = _sizes(sizes)
    opener = open_indexed or _open_indexed(config.mmap, config.path_to_cache)
    builder = _Builder(config, sizes_list, opener, group)
    if config.mock:
        low = MockGPTLowLevelDataset(config.vocab_size, config.eod_token_id)
        return builder.splits_of(low, split_document_ranges("1,1,1", len(low)), sizes_list)
    return build_from_paths(
        config, builder, lambda low: int(np.asarray(low.sequence_lengths).shape[0])
    )


def build_from_paths(config: Any, builder: _Builder, count: Callable[[Any], int]) -> list[Any]:
    """``[train, valid, test]`` from ``config.blend`` (split by ``config.split``) or per split.

    Args:
        config: a parsed config (``blend``, ``blend_per_split``, ``split``).
        builder: makes each corpus' split datasets and the blends.
        count: the number of split units of an opened corpus (sequences for GPT,
            documents for the masked datasets, as Megatron's ``numel_low_level_dataset``).
    """
    sizes_list = builder.sizes
    if config.blend is not None:
        prefixes, weights = config.blend
        fractions = parse_split(config.split)
        present = [bookend is not None for bookend in split_matrix(fractions)]

        def ranges_of(low: Any) -> list[tuple[int, int] | None]:
            return split_document_ranges(fractions, count(low))

        return builder.blend(prefixes, weights, ranges_of, sizes_list, present)
    out: list[Any] = [None, None, None]
    for i, blend in enumerate(config.blend_per_split):
        if blend is None:
            continue
        prefixes, weights = blend
        only = [None, None, None]
        only_sizes: list[int | None] = [0, 0, 0]
        only_sizes[i] = sizes_list[i]
        present = [j == i for j in range(3)]

        def ranges_of(low: Any, i: int = i, only: list = only) -> list[tuple[int, int] | None]:
            ranges = list(only)
            ranges[i] = (0, count(low))
            return ranges

        # Megatron-Core uses a lone per-split prefix directly, even when it has a weight
        out[i] = builder.blend(
            prefixes, weights, ranges_of, only_sizes, present, single_ignores_weight=True
        )[i]
    return out
