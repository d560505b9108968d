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
with one pass of vectorized arithmetic (see :func:`build_sample_index`).

All functions are pure: the only randomness is the ``RandomState`` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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

    Args:
        documents: int array ``[num_documents]`` of document ids to expose.
        num_epochs: number of repetitions (>= 1).
        random_state: the generator; advanced by one shuffle (two when separate).
        separate_final_epoch: shuffle the last repetition on its own.

    Returns:
        int32 array ``[num_epochs * num_documents]``.
    """
    documents = np.asarray(documents)
    if not separate_final_epoch or num_epochs == 1:
        # Shuffling 8-byte items takes numpy's specialized (faster) path; the permutation
        # depends only on the length, so it equals Megatron's shuffle of the int32 array.
        index = np.tile(documents.astype(np.int64, copy=False), num_epochs)
        random_state.shuffle(index)
        return index.astype(np.int32)
    first = build_document_index(documents, num_epochs - 1, random_state, False)
    last = build_document_index(documents, 1, random_state, False)
    return np.concatenate((first, last))


def _shuffled_documents_and_lengths(
    packed: np.ndarray,
    num_epochs: int,
    random_state: np.random.RandomState,
    separate_final_epoch: bool,
) -> np.ndarray:
    """:func:`build_document_index` on ``(length << 32) | document`` int64 items.

    Shuffling these 8-byte items moves each document's length along with its id, so
    the sample index needs no random gather of lengths afterwards; the permutation is
    the same as for the plain ids (it depends only on the length of the array).
    """
    if not separate_final_epoch or num_epochs == 1:
        index = np.tile(packed, num_epochs)
        random_state.shuffle(index)
        return index
    first = _shuffled_documents_and_lengths(packed, num_epochs - 1, random_state, False)
    last = _shuffled_documents_and_lengths(packed, 1, random_state, False)
    return np.concatenate((first, last))


def sample_index_dtype(document_index_size: int, max_document_length: int) -> type[np.integer]:
    """Return the integer dtype Megatron-Core picks for the sample index (int32 when it fits)."""
    if max(document_index_size, max_document_length) <= np.iinfo(np.int32).max:
        return np.int32
    return np.int64


def count_samples(
    total_tokens: int,
    seq_length: int,
    drop_last_partial_sequence: bool,
    add_extra_token_to_sequence: bool,
) -> int:
    """Number of windows in ``total_tokens`` tokens, with Megatron's float32 rounding.

    When the last partial window is kept, helpers.cpp computes
    ``ceil(float(tokens - extra) / seq_length)`` in *single* precision; that
    rounding is reproduced here because it decides the sample count.
    """
    usable = total_tokens - int(add_extra_token_to_sequence)
    if drop_last_partial_sequence:
        return usable // seq_length
    return int(np.ceil(np.float32(usable) / np.float32(seq_length)))


def _rows_by_search(
    ends: np.ndarray, doc_lengths: np.ndarray, count: int, seq_length: int, extra: int, dtype: type
) -> np.ndarray:
    """Rows ``0..count`` by binary search of each window's last token (few windows per document)."""
    out = np.empty((count + 1, 2), dtype=dtype)
    out[0] = 0
    positions = np.arange(1, count + 1, dtype=np.int64)
    positions *= seq_length
    doc = np.searchsorted(ends, positions + (extra - 1), side="right")
    out[1:, 0] = doc
    starts = np.take(ends, doc)
    starts -= np.take(doc_lengths, doc)
    np.subtract(positions, starts, out=out[1:, 1], casting="unsafe")
    return out


def _rows_by_repeat(
    ends: np.ndarray,
    doc_lengths: np.ndarray,
    count: int,
    num_samples: int,
    seq_length: int,
    extra: int,
    dtype: type,
) -> np.ndarray:
    """Rows ``0..count`` by counting the window ends in each document (many windows per document)."""
    num_docs = doc_lengths.shape[0]
    # covered[j]: windows k >= 1 whose last token (k * s + extra - 1) lies before ends[j]
    covered = ends - extra
    np.floor_divide(covered, seq_length, out=covered)
    np.clip(covered, 0, num_samples, out=covered)
    # table row 0 is window 0 = (0, 0); row j + 1 is (document j, its start position)
    table = np.empty((num_docs + 1, 2), dtype=dtype)
    table[0] = 0
    table[1:, 0] = np.arange(num_docs, dtype=dtype)
    # start positions modulo the dtype's range: the offsets fit, so wrapping arithmetic is exact
    np.subtract(ends, doc_lengths, out=table[1:, 1], casting="unsafe")
    repeats = np.empty(num_docs + 1, dtype=np.int64)
    repeats[0] = 1
    np.subtract(covered[1:], covered[:-1], out=repeats[2:])
    repeats[1 : min(2, num_docs + 1)] = covered[:1]
    out = np.repeat(table, repeats, axis=0)  # [count + 1, 2]: (document, start)
    positions = np.arange(count + 1, dtype=dtype)
    np.multiply(positions, seq_length, out=positions)  # wraps like the starts do
    np.subtract(positions, out[:, 1], out=out[:, 1])
    return out


def build_sample_index(
    sequence_lengths: np.ndarray,
    document_index: np.ndarray,
    seq_length: int,
    num_epochs: int,
    num_tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
    document_lengths: np.ndarray | None = None,
) -> np.ndarray:
    """Build the sample index equal to Megatron-Core's ``helpers.build_sample_idx``.

    Window ``k`` starts at global token position ``p = k * seq_length`` of the
    concatenated documents ``document_index[0], document_index[1], ...``. Its row is
    ``(j, p - start(j))`` where ``j`` is the document holding the window's last token
    ``p + extra - 1`` (zero-length documents are skipped). A window that runs past
    the last document (only when the partial last window is kept) ends at
    ``(last, length(last) - extra)``, as in the C++ loop.

    Args:
        sequence_lengths: int array ``[corpus documents]``, tokens per document.
        document_index: int array ``[D]`` from :func:`build_document_index`.
        seq_length: tokens per sample.
        num_epochs: epochs in ``document_index``.
        num_tokens_per_epoch: tokens per epoch.
        drop_last_partial_sequence: drop (True) or keep (False, padded) a last partial window.
        add_extra_token_to_sequence: windows hold ``seq_length + 1`` tokens.
        document_lengths: ``sequence_lengths[document_index]`` when already known.

    Returns:
        ``[num_samples + 1, 2]`` array, int32 unless the sizes need int64.
    """
    extra = int(add_extra_token_to_sequence)
    total_tokens = num_epochs * num_tokens_per_epoch
    num_samples = count_samples(total_tokens, seq_length, drop_last_partial_sequence, bool(extra))
    lengths = np.asarray(sequence_lengths)
    if document_lengths is None:  # int64 indices take numpy's fastest gather path
        doc_lengths = np.take(lengths, np.asarray(document_index).astype(np.int64, copy=False))
    else:
        doc_lengths = np.asarray(document_lengths)
    num_docs = doc_lengths.shape[0]
    dtype = sample_index_dtype(num_docs, int(lengths.max()) if lengths.size else 0)

    # ends[j]: global token position one past document j (exact, int64)
    ends = np.cumsum(doc_lengths, dtype=np.int64)
    total = int(ends[-1]) if num_docs else 0
    num_covered = min(num_samples, max(0, (total - extra) // seq_length))
    if 2 * num_samples < num_docs:
        out = _rows_by_search(ends, doc_lengths, num_covered, seq_length, extra, dtype)
    else:
        out = _rows_by_repeat(ends, doc_lengths, num_covered, num_samples, seq_length, extra, dtype)
    if num_covered < num_samples:  # kept partial window(s) running past the last document
        tail = np.empty((num_samples - num_covered, 2), dtype=dtype)
        tail[:, 0] = num_docs - 1
        tail[:, 1] = int(doc_lengths[-1]) - extra
        out = np.concatenate((out, tail))
    return out


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
    first = np.arange(num_samples, dtype=np.int64)  # 8-byte items: numpy's faster shuffle
    random_state.shuffle(first)
    if num_samples == total_size:
        return first.astype(dtype, copy=False)
    last = np.arange(num_samples, total_size, dtype=np.int64)
    random_state.shuffle(last)
    return np.concatenate((first, last)).astype(dtype, copy=False)


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
    """
    lengths = np.asarray(sequence_lengths)
    documents = np.asarray(documents)
    if num_tokens_per_epoch is None:
        num_tokens_per_epoch = tokens_in_documents(lengths, documents)
    plan = plan_epochs(num_tokens_per_epoch, num_samples, seq_length, add_extra_token_to_sequence)
    random_state = np.random.RandomState(seed)
    if documents.size and int(documents.min()) >= 0 and int(documents.max()) < 2**31:
        # shuffle (length, id) pairs together: the same permutation, no gather afterwards
        packed = document_lengths_of(lengths, documents).astype(np.int64) << 32
        packed |= documents.astype(np.int64)
        shuffled = _shuffled_documents_and_lengths(
            packed, plan.num_epochs, random_state, plan.separate_final_epoch
        )
        document_index = shuffled.astype(np.int32)  # the low 32 bits: the ids
        shuffled >>= 32
        document_lengths: np.ndarray | None = shuffled
    else:
        document_index = build_document_index(
            documents, plan.num_epochs, random_state, plan.separate_final_epoch
        )
        document_lengths = None
    sample_index = build_sample_index(
        lengths,
        document_index,
        seq_length,
        plan.num_epochs,
        num_tokens_per_epoch,
        drop_last_partial_sequence,
        add_extra_token_to_sequence,
        document_lengths=document_lengths,
    )
    total = sample_index.shape[0] - 1
    first = plan.num_samples_sans_final_epoch if plan.separate_final_epoch else total
    shuffle_index = build_shuffle_index(first, total, random_state)
    return document_index, sample_index, shuffle_index
