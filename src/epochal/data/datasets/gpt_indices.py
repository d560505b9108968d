"""Megatron-Core's three GPT indices (document, sample, shuffle), built with numpy only.

A GPT dataset cuts fixed-length token windows out of the stream of documents
laid end to end, epoch after epoch. Three arrays say which window sample ``i``
is, exactly as Megatron-Core's ``GPTDataset`` (megatron/core/datasets/gpt_dataset.py
and helpers.cpp ``build_sample_idx``) builds them, so sample ``i`` is the same
token window in both:

- the *document index* (int32 ``[num_epochs * num_documents]``): the exposed
  document ids repeated once per epoch and shuffled with
  ``numpy.random.RandomState(seed)``; when the final epoch is only partly used
  (fewer than 80% of an epoch's samples) it is shuffled separately so that its
  documents are not spread across the earlier epochs;
- the *sample index* (int32 or int64 ``[num_samples + 1, 2]``): row ``k`` is the
  ``(position in the document index, token offset in that document)`` where
  window ``k`` starts; window ``k`` spans ``seq_length + add_extra_token``
  tokens, and consecutive windows overlap by ``add_extra_token`` tokens;
- the *shuffle index* (uint32, or int64 for huge sizes, ``[num_samples]``): a
  permutation of the windows, with the windows of a separated final epoch
  shuffled among themselves only.

Megatron builds the sample index with a compiled C++ loop over documents; here
it is computed in closed form: window ``k`` starts at global token position
``k * seq_length``, so its row is found from the cumulative document lengths
with a few vectorized passes over cache-sized blocks (see
:mod:`epochal.data.datasets.gpt_sample_index`). The two shuffles are Megatron's own
``RandomState.shuffle`` calls on arrays of the same item size.

All functions are pure: the only randomness is the ``RandomState`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from epochal.data.datasets.gpt_sample_index import (
    build_sample_index,
    count_samples,
    length_table,
    sample_index_dtype,
)

__all__ = [
    "EpochPlan",
    "build_document_index",
    "build_gpt_indices",
    "build_sample_index",
    "build_shuffle_index",
    "count_samples",
    "document_lengths_of",
    "document_range",
    "plan_epochs",
    "sample_index_dtype",
    "tokens_in_documents",
]
#: Megatron-Core's threshold below which the final, partial epoch is shuffled separately.
SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80


@dataclass(frozen=True)
class EpochPlan:
    """How many epochs a GPT index spans and whether its last epoch is separate.

    Attributes:
        num_tokens_per_epoch: tokens in one pass over the exposed documents.
        num_epochs: passes over the documents needed to cover the requested samples.
        separate_final_epoch: whether the final epoch is shuffled on its own.
        num_samples_sans_final_epoch: samples (windows) that fit in the first
            ``num_epochs - 1`` epochs; meaningful only when ``separate_final_epoch``.
    """

    num_tokens_per_epoch: int
    num_epochs: int
    separate_final_epoch: bool
    num_samples_sans_final_epoch: int


def plan_epochs(
    num_tokens_per_epoch: int,
    num_samples: int | None,
    seq_length: int,
    add_extra_token_to_sequence: bool = True,
) -> EpochPlan:
    """Return the number of epochs and the final-epoch rule, as Megatron-Core computes them.

    Args:
        num_tokens_per_epoch: total tokens of the exposed documents (> 0).
        num_samples: samples requested, or ``None`` for exactly one epoch.
        seq_length: tokens per sample (>= 1).
        add_extra_token_to_sequence: whether each window has ``seq_length + 1`` tokens.

    Returns:
        The :class:`EpochPlan`.

    Raises:
        ValueError: if ``num_tokens_per_epoch`` is not positive (Megatron-Core
            loops forever there), or ``seq_length``/``num_samples`` is invalid.
    """
    if num_tokens_per_epoch <= 0:
        raise ValueError(
            f"the documents hold no tokens (num_tokens_per_epoch={num_tokens_per_epoch})"
        )
    if seq_length < 1:
        raise ValueError(f"seq_length must be >= 1, got {seq_length}")
    if num_samples is not None and num_samples < 0:
        raise ValueError(f"num_samples must be >= 0 or None, got {num_samples}")
    extra = int(add_extra_token_to_sequence)
    if num_samples is None:
        return EpochPlan(num_tokens_per_epoch, 1, False, 0)
    tokens_requested = num_samples * seq_length + extra
    # smallest n >= 1 with n * tokens_per_epoch >= tokens_requested (Megatron's while loop)
    num_epochs = max(1, -(-tokens_requested // num_tokens_per_epoch))
    if num_epochs == 1:
        return EpochPlan(num_tokens_per_epoch, 1, False, 0)
    sans_final = ((num_epochs - 1) * num_tokens_per_epoch - extra) // seq_length
    from_final = num_samples - sans_final
    per_epoch = (num_tokens_per_epoch - extra) // seq_length
    separate = from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)
    return EpochPlan(num_tokens_per_epoch, num_epochs, separate, sans_final)


def build_document_index(
    documents: np.ndarray,
    num_epochs: int,
    random_state: np.random.RandomState,
    separate_final_epoch: bool,
) -> np.ndarray:
    """Repeat ``documents`` ``num_epochs`` times and shuffle, as Megatron-Core does.

    The shuffle is the same ``RandomState.shuffle`` of an int32 array as Megatron's
    (same permutation, same item size, so the same cost on any machine).

    Args:
        documents: int array ``[num_documents]`` of document ids to expose.
        num_epochs: number of repetitions (>= 1).
        random_state: the generator; advanced by one shuffle (two when separate).
        separate_final_epoch: shuffle the last repetition on its own.

    Returns:
        int32 array ``[num_epochs * num_documents]``.
    """
    documents = np.asarray(documents).astype(np.int32, copy=False)
    if not separate_final_epoch or num_epochs == 1:
        index = np.tile(documents, num_epochs)
        random_state.shuffle(index)
        return index
    index = np.tile(documents, num_epochs)
    first, last = index[: -documents.shape[0]], index[-documents.shape[0] :]
    random_state.shuffle(first)  # views of one array: no concatenation afterwards
    random_state.shuffle(last)
    return index


def build_shuffle_index(
    num_samples: int, total_size: int, random_state: np.random.RandomState
) -> np.ndarray:
    """Return a shuffled ``arange(total_size)``, shuffling ``[0, num_samples)`` and the rest apart.

    Args:
        num_samples: size of the first shuffled range.
        total_size: size of the whole index (>= ``num_samples``).
        random_state: the generator; advanced by one shuffle (two when the ranges differ).

    Returns:
        uint32 array ``[total_size]`` (int64 when ``total_size`` needs it), as Megatron-Core.
    """
    dtype = np.uint32 if total_size < np.iinfo(np.uint32).max - 1 else np.int64
    # Megatron's item size: the same shuffle, so the same cost on any machine (8-byte items
    # take numpy's specialized loop, faster where the array stays in cache, slower where
    # twice the bytes miss it)
    index = np.arange(total_size, dtype=dtype)
    random_state.shuffle(index[:num_samples])  # views of one array: no concatenation
    if num_samples < total_size:
        random_state.shuffle(index[num_samples:])
    return index


def document_range(documents: np.ndarray) -> tuple[int, int] | None:
    """Return ``(first, stop)`` when ``documents`` (2 or more ids) is ``arange(first, stop)``, else ``None``."""
    if documents.size < 2:
        return None
    first, last = int(documents[0]), int(documents[-1])
    if last - first + 1 == documents.size and np.all(np.diff(documents) == 1):
        return first, last + 1
    return None


def document_lengths_of(sequence_lengths: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """``sequence_lengths[documents]`` (a slice view when the documents are a contiguous range)."""
    bounds = document_range(documents)
    if bounds is not None:
        return sequence_lengths[bounds[0] : bounds[1]]
    return np.take(sequence_lengths, documents.astype(np.int64, copy=False))


def tokens_in_documents(sequence_lengths: np.ndarray, documents: np.ndarray) -> int:
    """Return the total length of ``documents`` in tokens."""
    return int(np.sum(document_lengths_of(sequence_lengths, documents), dtype=np.int64))


def build_gpt_indices(
    sequence_lengths: np.ndarray,
    documents: np.ndarray,
    num_samples: int | None,
    seq_length: int,
    seed: int,
    add_extra_token_to_sequence: bool = True,
    drop_last_partial_sequence: bool = True,
    num_tokens_per_epoch: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Build ``(document_index, sample_index, shuffle_index)`` like Megatron-Core's GPTDataset.

    Args:
        sequence_lengths: int array ``[corpus documents]`` of document lengths in tokens.
        documents: the document ids this dataset exposes (e.g. one split's range).
        num_samples: samples requested (the index may hold a few more), or ``None`` for one epoch.
        seq_length: tokens per sample.
        seed: seed of the ``numpy.random.RandomState`` used for both shuffles.
        add_extra_token_to_sequence: windows of ``seq_length + 1`` tokens.
        drop_last_partial_sequence: drop a trailing partial window (Megatron keeps it,
            padded, only for validation when asked).
        num_tokens_per_epoch: the documents' total length, when the caller already knows it.

    Returns:
        The three index arrays (see the module docstring for shapes and dtypes).

    Raises:
        ValueError: if the documents hold no tokens, or an argument is out of range.
        IndexError: a document id outside ``[0, len(sequence_lengths))``.
    """
    lengths = np.asarray(sequence_lengths)
    documents = np.asarray(documents)
    if documents.size and (int(documents.min()) < 0 or int(documents.max()) >= lengths.shape[0]):
        raise IndexError(
            f"documents hold ids in [{int(documents.min())}, {int(documents.max())}], "
            f"outside [0, {lengths.shape[0]})"
        )
    if num_tokens_per_epoch is None:
        num_tokens_per_epoch = tokens_in_documents(lengths, documents)
    plan = plan_epochs(num_tokens_per_epoch, num_samples, seq_length, add_extra_token_to_sequence)
    random_state = np.random.RandomState(seed)
    document_index = build_document_index(
        documents, plan.num_epochs, random_state, plan.separate_final_epoch
    )
    sample_index = build_sample_index(
        lengths,
        document_index,
        seq_length,
        plan.num_epochs,
        num_tokens_per_epoch,
        drop_last_partial_sequence,
        add_extra_token_to_sequence,
        table=length_table(lengths),  # the ids were checked above
    )
    total = sample_index.shape[0] - 1
    first = plan.num_samples_sans_final_epoch if plan.separate_final_epoch else total
    shuffle_index = build_shuffle_index(first, total, random_state)
    return document_index, sample_index, shuffle_index
