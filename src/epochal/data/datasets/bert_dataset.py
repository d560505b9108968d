"""BERTDataset: masked-LM samples of sentence runs, sample for sample as Megatron-Core.

``BERTDataset(indexed, document_ids, num_samples, seq_length, seed, tokenizer=...)``
reads a sentence-split corpus (one sequence per sentence, documents kept, as written by
``epochal preprocess --split-sentences``) and returns the samples of Megatron-Core
0.16.1's ``BERTMaskedWordPieceDataset`` for the same files, seed, tokenizer and options:
the sample index of :mod:`epochal.data.datasets.bert_indices`, then per sample a
``numpy.random.RandomState((seed + idx) % 2**32)`` that picks the segment split, the
"is random next" swap, the truncation and the masks
(:mod:`epochal.data.datasets.masked_lm`).

Each sample is a dict with Megatron's keys and types (``s = seq_length``):

- ``text``: int64 ``[s]``: ``[CLS] A [SEP] B [SEP]`` with masks applied, padding 0;
- ``types``: int64 ``[s]``: 0 for ``[CLS] A [SEP]``, 1 for ``B [SEP]``, the pad id on padding;
- ``labels``: int64 ``[s]``: the original id at masked positions, ``-1`` elsewhere
  (0 where the label equals the pad id, as Megatron);
- ``is_random``: int, 1 when A and B were swapped (the next-sentence label);
- ``padding_mask``: int64 ``[s]``: 1 on tokens, the pad id on padding (Megatron's
  convention; 0 for a ``[PAD] = 0`` vocabulary);
- ``loss_mask``: int64 ``[s]``: 1 at masked positions;
- ``truncated``: int, 1 when A + B had to be trimmed.

Samples are a pure function of (files, seed, options, index): no global random state
is read. Megatron's one use of numpy's global generator (the N-gram sizes of
``masking_do_permutation``) comes here from ``RandomState([seed, idx, 0x5045524D])``
(see :data:`PERMUTATION_SEED_WORD`).

Multi-epoch training: as in Megatron, ``num_samples`` above one epoch indexes further
epochs, and since every sample index has its own generator, a sentence run met again in
a later epoch gets fresh masks (and a fresh segment split). ``dataset[EpochIndex(e, i)]``
is sample ``i`` for every ``e`` (the epoch is ignored, as by ``GPTDataset``).
Megatron shuffles the rows of all epochs together, so an epoch of training is a count of
samples: :attr:`BERTDataset.samples_per_epoch` (the rows one pass over the documents
gives). :meth:`BERTDataset.sample_span` and :meth:`BERTDataset.earlier_occurrences` say
which sentences a sample holds and where the same run was drawn before (the trainer's
per-epoch evidence, :mod:`epochal.train.inputs.epoch_evidence`).
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from epochal.data.datasets.bert_indices import build_bert_sample_index
from epochal.data.datasets.gpt_dataset import SPLIT_NAMES
from epochal.data.datasets.index_cache import cached_arrays, pickle_arrays, unpickle_arrays
from epochal.data.datasets.masked_lm import (
    MaskingOptions,
    WordPieceVocabulary,
    create_masked_lm_predictions,
)
from epochal.data.epochs.epoch_index import EpochIndex

#: Megatron-Core's pad sentinel when the tokenizer's pad id is missing or ambiguous.
PAD_SENTINEL = -1

#: Third seed word of the permutation generator ``RandomState([seed, idx, word])``.
PERMUTATION_SEED_WORD = 0x5045524D


def pad_token_id(tokenizer: object) -> int:
    """The pad id Megatron-Core's datasets use: ``tokenizer.pad``, else ``-1``.

    Like Megatron-Core, a pad id equal to another special id (``special_tokens_dict``,
    else ``eos``/``eod``) is replaced by ``-1`` with a warning.
    """
    try:
        pad = int(tokenizer.pad)
    except Exception:  # noqa: BLE001 - Megatron catches everything here too
        return PAD_SENTINEL
    try:
        special = [v for k, v in tokenizer.special_tokens_dict.items() if k != "pad_token"]
    except (AttributeError, IndexError, ValueError):
        special = []
    if not special:
        for name in ("eos", "eod"):
            try:
                special.append(getattr(tokenizer, name))
            except (AttributeError, NotImplementedError):
                pass
    if pad in special:
        warnings.warn(
            f"the tokenizer's pad id {pad} equals another special token id; padding uses "
            f"{PAD_SENTINEL} instead (as Megatron-Core does)",
            stacklevel=3,
        )
        return PAD_SENTINEL
    return pad


class BERTDataset(Dataset):
    """Megatron-Core's ``BERTMaskedWordPieceDataset`` over any indexed dataset (duck-typed).

    Args:
        indexed_dataset: object with ``sequence_lengths`` (tokens per sentence, ``[S]``),
            ``document_indices`` (``[D + 1]`` sentence bounds) and
            ``get(idx) -> np.ndarray``; optionally ``path_prefix`` (used in messages).
        document_ids: contiguous document ids to expose (a split's range); ``None`` = all.
        num_samples: whole epochs are indexed until there are at least this many samples;
            ``None`` = one epoch.
        seq_length: tokens per sample including ``[CLS]`` and two ``[SEP]`` (>= 5).
        seed: seed of the index shuffle and of every sample (``0 <= seed < 2**31 - 1``,
            the range of Megatron's C ``int`` seed).
        tokenizer: a WordPiece tokenizer with ``cls``, ``sep``, ``mask``, ``pad`` and
            ``inv_vocab`` (Megatron's ``BertWordPieceLowerCase`` interface).
        masking: the masking options.
        short_sequence_probability: probability of a shorter target length.
        classification_head: two segments per sample and the next-sentence swap.
        split: ``"train"``, ``"valid"`` or ``"test"`` (file names, messages).
        cache_dir: where the sample index is cached; ``None`` = in memory.
        group: ``torch.distributed`` group whose rank 0 builds the cache.

    Attributes:
        sample_index: ``[samples, 3]`` rows ``(first sentence, end sentence, target length)``.
        cache_info: ``cache_hit``, ``hash`` and ``paths`` of the index cache.

    Raises:
        ValueError: bad arguments, a tokenizer without ``cls``/``sep``/``mask``, or a
            corpus with no document of enough sentences (the message names the file and,
            for two segments, ``classification_head``).
    """

    #: tokens of a sample that are not corpus tokens ([CLS] and two [SEP]); the sample
    #: index targets ``seq_length - RESERVED_TOKENS`` corpus tokens.
    RESERVED_TOKENS = 3

    def __init__(
        self,
        indexed_dataset: Any,
        document_ids: np.ndarray | None,
        num_samples: int | None,
        seq_length: int,
        seed: int,
        *,
        tokenizer: Any,
        masking: MaskingOptions,
        short_sequence_probability: float = 0.1,
        classification_head: bool = True,
        split: str = "train",
        cache_dir: str | os.PathLike | None = None,
        group: Any = None,
    ) -> None:
        if split not in SPLIT_NAMES:
            raise ValueError(f"split must be one of {SPLIT_NAMES}, got {split!r}")
        if not hasattr(indexed_dataset, "document_indices"):
            raise TypeError(
                "indexed_dataset must have Megatron's IndexedDataset interface "
                f"(sequence_lengths, document_indices, get), got {type(indexed_dataset).__name__}"
            )
        if seq_length < 5:
            raise ValueError(
                f"seq_length must be >= 5 ([CLS], 2 x [SEP], 2 tokens), got {seq_length}"
            )
        if not 0 <= seed < 2**31 - 1:
            raise ValueError(f"seed must be in [0, 2**31 - 1) for BERT data, got {seed}")
        self.vocab = WordPieceVocabulary(tokenizer)
        self.pad_token_id = pad_token_id(tokenizer)
        self.dataset = indexed_dataset
        self.name = os.fspath(
            getattr(indexed_dataset, "path_prefix", None) or type(indexed_dataset).__name__
        )
        self.split = split
        self.seq_length = int(seq_length)
        self.seed = int(seed)
        self.masking = masking
        self.short_sequence_probability = float(short_sequence_probability)
        self.classification_head = bool(classification_head)
        self.num_samples_requested = num_samples

        bounds = np.asarray(indexed_dataset.document_indices, dtype=np.int64)
        sizes = np.asarray(indexed_dataset.sequence_lengths)
        corpus = bounds.shape[0] - 1
        if document_ids is None:
            first, end = 0, corpus
        else:
            documents = np.asarray(document_ids)
            if documents.size == 0:
                raise ValueError(f"the {split} split of {self.name} is empty (0 documents)")
            first, end = int(documents[0]), int(documents[-1]) + 1
            if not np.array_equal(documents, np.arange(first, end)) or first < 0 or end > corpus:
                raise ValueError(
                    f"document_ids must be a contiguous range inside [0, {corpus}) for {self.name}"
                )
        split_bounds = bounds[first : end + 1]
        min_sentences = 2 if self.classification_head else 1
        max_length = self.seq_length - self.RESERVED_TOKENS

        def identity() -> dict[str, Any]:
            lo, hi = int(split_bounds[0]), int(split_bounds[-1])
            return {
                "sentence_bounds": split_bounds,
                "sentence_lengths": np.ascontiguousarray(sizes[lo:hi]),
                "corpus_sentences": int(sizes.shape[0]),
                "num_samples": num_samples,
                "max_length": max_length,
                "short_sequence_probability": self.short_sequence_probability,
                "seed": self.seed,
                "min_sentences": min_sentences,
            }

        def build() -> dict[str, np.ndarray]:
            try:
                index = build_bert_sample_index(
                    split_bounds,
                    sizes,
                    num_samples,
                    max_length,
                    self.short_sequence_probability,
                    self.seed,
                    min_sentences,
                )
            except ValueError as err:
                raise self._no_samples(err) from None
            if index.shape[0] == 0 and num_samples != 0:
                raise self._no_samples(None)
            return {"sample_index": index}

        arrays, self.cache_info = cached_arrays(
            cache_dir,
            type(self).__name__,
            split,
            identity,
            ("sample_index",),
            build,
            group=group,
            note={"dataset": self.name, "documents": [first, end]},
        )
        self.sample_index = arrays["sample_index"]
        self._one_epoch_args = (split_bounds, max_length, min_sentences)
        self._samples_per_epoch: int | None = None
        self._local = threading.local()

    @property
    def samples_per_epoch(self) -> int:
        """Samples of one pass over the split's documents (the first epoch of the index).

        Later passes can differ by a few samples (their target lengths are drawn afresh,
        the generator running on); computed once on first use (one pass, no caching).
        """
        if self._samples_per_epoch is None:
            bounds, max_length, min_sentences = self._one_epoch_args
            one = build_bert_sample_index(
                bounds,
                np.asarray(self.dataset.sequence_lengths),
                None,
                max_length,
                self.short_sequence_probability,
                self.seed,
                min_sentences,
            )
            self._samples_per_epoch = int(one.shape[0])
        return self._samples_per_epoch

    def sample_span(self, idx: int) -> tuple[int, int]:
        """``(first sentence, end sentence)`` (corpus sentence ids, end exclusive) of sample ``idx``.

        Raises:
            IndexError / TypeError: as ``dataset[idx]``.
        """
        begin, end = self.sample_index[self._index(idx), :2]
        return int(begin), int(end)

    def sample_identity(self, idx: int | EpochIndex) -> dict[str, Any]:
        """Which sentences sample ``idx`` is built from (its masks are seeded by ``index``).

        Returns:
            ``{"dataset": name, "index": i, "document": d, "sentences": [first, last]}``:
            the corpus file name (prefix without the folder), the sample's index in this
            dataset, the document and its first and last sentence (corpus sentence ids,
            inclusive).

        Raises:
            IndexError / TypeError: as ``dataset[idx]``.
        """
        i = self._index(idx)
        begin, end = self.sample_index[i, :2].tolist()
        bounds = self.dataset.document_indices
        document = int(np.searchsorted(bounds, begin, side="right")) - 1
        return {
            "dataset": os.path.basename(self.name),
            "index": i,
            "document": document,
            "sentences": [begin, end - 1],
        }

    def earlier_occurrences(self, idx: int, before: int) -> np.ndarray:
        """Indices ``< before`` of the samples built from the same sentences as sample ``idx``.

        Returns:
            int64 ``[k]``, ascending (``before`` is clipped to ``[0, len(self)]``).
        """
        begin, end = self.sample_span(idx)
        rows = self.sample_index[: max(0, min(int(before), len(self))), :2]
        return np.flatnonzero((rows[:, 0] == begin) & (rows[:, 1] == end)).astype(np.int64)

    def _generators(self) -> tuple[np.random.RandomState, np.random.RandomState]:
        """This thread's two generators, reseeded per sample (creating one costs ~100x more)."""
        local = self._local
        if not hasattr(local, "state"):
            local.state, local.permutation = np.random.RandomState(0), np.random.RandomState(0)
        return local.state, local.permutation

    def _no_samples(self, err: ValueError | None) -> ValueError:
        reason = f" ({err})" if err else ""
        if self.classification_head:
            return ValueError(
                f"{self.name}: the {self.split} split has no document of two or more sentences"
                f"{reason}, but classification_head=True needs two segments per sample; "
                "preprocess the corpus with --split-sentences (one sequence per sentence) or "
                "set classification_head=False"
            )
        return ValueError(
            f"{self.name}: the {self.split} split yields no {type(self).__name__} sample{reason}"
        )

    def __len__(self) -> int:
        """Number of samples (>= ``num_samples`` when that was given)."""
        return int(self.sample_index.shape[0])

    def _index(self, idx: Any) -> int:
        if isinstance(idx, EpochIndex):
            idx = idx.idx
        if isinstance(idx, bool) or not isinstance(idx, int | np.integer):
            raise TypeError(
                f"BERTDataset index must be an int or EpochIndex, got {type(idx).__name__}"
            )
        i, n = int(idx), len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {int(idx)} out of range for BERTDataset of length {n}")
        return i

    def __getitem__(self, idx: int | EpochIndex) -> dict[str, Any]:
        """Return sample ``idx`` (see the module docstring for the keys).

        Raises:
            IndexError: ``idx`` out of range. TypeError: not an int or ``EpochIndex``.
        """
        idx = self._index(idx)
        begin, end, target = (int(v) for v in self.sample_index[idx])
        sentences = [self.dataset.get(i).tolist() for i in range(begin, end)]
        state, permutation_state = self._generators()
        state.seed((self.seed + idx) % 2**32)  # Megatron: RandomState(seed=(seed + idx) % 2**32)
        vocab, seq_length, pad = self.vocab, self.seq_length, self.pad_token_id

        pivot, is_random = len(sentences), False
        if self.classification_head:
            pivot = 1
            if len(sentences) >= 3:
                pivot = state.randint(low=1, high=len(sentences))
            is_random = state.random() < 0.5
        split_a = [t for sentence in sentences[:pivot] for t in sentence]
        split_b = [t for sentence in sentences[pivot:] for t in sentence]
        if is_random:
            split_a, split_b = split_b, split_a

        # trim the longer segment at a random end until both fit the target length
        a0, a1, b0, b1 = 0, len(split_a), 0, len(split_b)
        truncated = a1 + b1 > target
        while (a1 - a0) + (b1 - b0) > target:
            front = state.random() < 0.5
            if a1 - a0 > b1 - b0:
                a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
            else:
                b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
        split_a, split_b = split_a[a0:a1], split_b[b0:b1]

        tokens = [vocab.cls, *split_a, vocab.sep]
        types = [0] * len(tokens)
        if split_b:
            tokens += [*split_b, vocab.sep]
            types += [1] * (len(split_b) + 1)

        if self.masking.do_permutation:
            permutation_state.seed([self.seed, idx, PERMUTATION_SEED_WORD])
        tokens, positions, labels_at = create_masked_lm_predictions(
            tokens, target, state, vocab, self.masking, permutation_state
        )

        length = len(tokens)
        text = np.full(seq_length, pad, dtype=np.int64)
        text[:length] = tokens
        assignments = np.full(seq_length, pad, dtype=np.int64)
        assignments[:length] = types
        padding_mask = np.ones(seq_length, dtype=np.int64)
        padding_mask[text == pad] = pad
        labels = np.full(seq_length, -1, dtype=np.int64)
        labels[positions] = labels_at
        loss_mask = np.zeros(seq_length, dtype=np.int64)
        loss_mask[positions] = 1
        text[text == pad] = 0
        labels[labels == pad] = 0
        return {
            "text": text,
            "types": assignments,
            "labels": labels,
            "is_random": int(is_random),
            "padding_mask": padding_mask,
            "loss_mask": loss_mask,
            "truncated": int(truncated),
        }

    def __getstate__(self) -> dict[str, Any]:
        """Pickle a cached index as its file name (workers map the file again)."""
        state = pickle_arrays(self.__dict__, ("sample_index",))
        del state["_local"]  # per-thread generators are recreated on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(unpickle_arrays(state, ("sample_index",)))
        self._local = threading.local()

    def __repr__(self) -> str:
        return (
            f"BERTDataset({self.name!r}, split={self.split}, samples={len(self)}, "
            f"seq_length={self.seq_length}, seed={self.seed}, "
            f"classification_head={self.classification_head})"
        )
