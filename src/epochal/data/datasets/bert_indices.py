"""The BERT sample index: runs of whole sentences, as Megatron-Core's ``helpers.build_mapping``.

A masked-LM sample is a run of consecutive sentences of one document.
:func:`build_bert_sample_index` returns, for every sample, ``(first sentence, end
sentence, target length)`` equal to the compiled ``helpers.build_mapping`` of
Megatron-Core 0.16.1 (``helpers.cpp``) for the same arguments, row for row:

- a document takes part when it has ``>= min_sentences`` sentences and (when it has
  more than one) none longer than 512 tokens;
- within a document, sentences are added until the run holds ``>= target`` tokens,
  at least ``min_sentences`` sentences, and more than one sentence is left; the last
  run of a document takes the rest;
- the target length is ``max_length``, or with probability ``~short_seq_prob`` a
  shorter one, drawn from ``std::mt19937(seed)`` (one draw per document start and one
  after each sample, the generator running on across epochs);
- whole epochs are added until at least ``num_samples`` samples exist, then all rows
  are shuffled by a Fisher-Yates pass driven by ``std::mt19937_64(seed + 1)``.

Both generators are reproduced in numpy: ``std::mt19937`` is numpy's legacy-seeded
``MT19937``; ``std::mt19937_64`` is :class:`MT19937_64` (vectorized per 312-word block).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

#: Megatron's ``LONG_SENTENCE_LEN``: a multi-sentence document with a longer sentence is skipped.
LONG_SENTENCE_LEN = 512

_U64 = np.uint64


class MT19937_64:
    """``std::mt19937_64``: the 64-bit Mersenne Twister of the C++ standard library.

    Args:
        seed: the ``result_type`` seed (taken modulo ``2**64``).
    """

    _N, _M = 312, 156
    _MATRIX_A = _U64(0xB5026F5AA96619E9)
    _UPPER = _U64(0xFFFFFFFF80000000)
    _LOWER = _U64(0x7FFFFFFF)

    def __init__(self, seed: int) -> None:
        state = [int(seed) % 2**64]
        for i in range(1, self._N):
            prev = state[-1]
            state.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) % 2**64)
        self._state = np.array(state, dtype=np.uint64)
        self._buffer = np.empty(0, dtype=np.uint64)

    def _twist(self) -> None:
        mt, n, m = self._state, self._N, self._M
        new = np.empty_like(mt)

        def mix(cur: np.ndarray, nxt: np.ndarray, far: np.ndarray) -> np.ndarray:
            x = (cur & self._UPPER) | (nxt & self._LOWER)
            return far ^ (x >> _U64(1)) ^ np.where(x & _U64(1), self._MATRIX_A, _U64(0))

        new[: n - m] = mix(mt[: n - m], mt[1 : n - m + 1], mt[m:])
        new[n - m : n - 1] = mix(mt[n - m : n - 1], mt[n - m + 1 :], new[: m - 1])
        new[n - 1 :] = mix(mt[n - 1 :], new[:1], new[m - 1 : m])
        self._state = new

    def _block(self) -> np.ndarray:
        self._twist()
        y = self._state.copy()
        y ^= (y >> _U64(29)) & _U64(0x5555555555555555)
        y ^= (y << _U64(17)) & _U64(0x71D67FFFEDA60000)
        y ^= (y << _U64(37)) & _U64(0xFFF7EEE000000000)
        y ^= y >> _U64(43)
        return y

    def draw(self, count: int) -> np.ndarray:
        """Return the next ``count`` outputs (uint64 ``[count]``)."""
        parts = [self._buffer]
        have = self._buffer.shape[0]
        while have < count:
            block = self._block()
            parts.append(block)
            have += block.shape[0]
        out = np.concatenate(parts)
        self._buffer = out[count:]
        return out[:count]


class _TargetLengths:
    """Megatron's ``get_target_sample_len`` draws of ``std::mt19937(seed)``, in chunks.

    ``values[pos]`` is the target length of the ``pos``-th draw (numpy's legacy-seeded
    ``MT19937`` is ``std::mt19937``); :meth:`reserve` makes sure ``count`` more exist.
    """

    def __init__(self, seed: int, short_seq_ratio: int, max_length: int) -> None:
        legacy = np.random.RandomState(seed).get_state()
        self._generator = np.random.MT19937()
        self._generator.state = {
            "bit_generator": "MT19937",
            "state": {"key": legacy[1], "pos": legacy[2]},
        }
        self.ratio, self.max_length = short_seq_ratio, max_length
        self.values: list[int] = []

    def reserve(self, pos: int, count: int) -> None:
        if self.ratio == 0 or pos + count <= len(self.values):
            return
        raw = self._generator.random_raw(max(count, 1 << 16)).astype(np.uint64)
        short = raw % np.uint64(self.ratio) == 0
        lengths = np.where(short, 2 + raw % np.uint64(self.max_length - 1), self.max_length)
        self.values = self.values[pos:] + lengths.astype(np.int64).tolist()

    def consumed(self, pos: int) -> int:
        """Drop the first ``pos`` values (already used); return the new position 0."""
        del self.values[:pos]
        return 0


def _eligible_documents(
    sentence_bounds: np.ndarray, sizes: np.ndarray, min_sentences: int
) -> np.ndarray:
    """Indices of the documents that yield samples (enough sentences, none too long)."""
    counts = np.diff(sentence_bounds)
    too_long = (sizes > LONG_SENTENCE_LEN).astype(np.int64)
    long_before = np.concatenate(([0], np.cumsum(too_long)))
    has_long = long_before[sentence_bounds[1:]] > long_before[sentence_bounds[:-1]]
    return np.flatnonzero((counts >= min_sentences) & ~((counts > 1) & has_long))


def _one_epoch(
    starts: list[int],
    ends: list[int],
    cumulative: list[int],
    min_sentences: int,
    targets: _TargetLengths,
    out: list[int],
) -> None:
    """Append one epoch's ``begin, end, target`` triples (flat) to ``out``, in corpus order."""
    fixed = targets.ratio == 0
    length = targets.max_length
    values = targets.values
    pos = 0
    append = out.append
    for first, last in zip(starts, ends):
        if not fixed:
            if pos + (last - first) + 1 > len(values):
                targets.reserve(pos, (last - first) + 1)
                values, pos = targets.values, 0
            length = values[pos]
            pos += 1
        begin = first
        while True:
            # the first end >= begin + min where the run reaches the target length ...
            end = bisect_left(cumulative, cumulative[begin] + length)
            if end < begin + min_sentences:
                end = begin + min_sentences
            # ... unless fewer than two sentences would be left: then take the rest
            if end > last - 2:
                end = last
            append(begin)
            append(end)
            append(length)
            if not fixed:
                length = values[pos]
                pos += 1
            if end == last:
                break
            begin = end
    if not fixed:
        targets.consumed(pos)


def build_bert_sample_index(
    sentence_bounds: np.ndarray,
    sizes: np.ndarray,
    num_samples: int | None,
    max_length: int,
    short_seq_prob: float,
    seed: int,
    min_sentences: int,
) -> np.ndarray:
    """Megatron-Core's ``helpers.build_mapping`` in numpy.

    Args:
        sentence_bounds: int ``[D + 1]``: document ``d`` holds the sentences
            ``[sentence_bounds[d], sentence_bounds[d + 1])`` (Megatron passes
            ``document_indices[split documents + one]``).
        sizes: int ``[S]``, tokens per sentence (the corpus' ``sequence_lengths``).
        num_samples: whole epochs are built until there are at least this many
            samples; ``None`` = exactly one epoch (Megatron's ``num_epochs=1``).
        max_length: the full target length in tokens (``> 1``).
        short_seq_prob: probability in ``[0, 1]`` of a shorter target length
            (used as the ratio ``round(1 / p)``, as Megatron does).
        seed: seed of both generators (``0 <= seed < 2**31 - 1``).
        min_sentences: sentences a sample needs at least (1, or 2 for two segments).

    Returns:
        ``[samples, 3]`` rows ``(first sentence, end sentence (exclusive), target
        length)``, shuffled; ``uint32`` (``uint64`` when ``S >= 2**32``), as Megatron.

    Raises:
        ValueError: ``num_samples > 0`` but no document has ``min_sentences``
            sentences (Megatron loops over ``2**31`` empty epochs instead).
    """
    bounds = np.asarray(sentence_bounds, dtype=np.int64)
    sizes = np.asarray(sizes)
    if max_length < 2:
        raise ValueError(f"max_length must be > 1, got {max_length}")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    short_seq_ratio = int(round(1.0 / short_seq_prob)) if short_seq_prob > 0 else 0
    eligible = _eligible_documents(bounds, sizes, min_sentences)
    starts, ends = bounds[:-1][eligible].tolist(), bounds[1:][eligible].tolist()
    cumulative = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).tolist()
    targets = _TargetLengths(seed, short_seq_ratio, max_length)
    rows: list[int] = []  # flat begin, end, target triples
    epochs = 0
    while (len(rows) < 3 * num_samples) if num_samples is not None else (epochs == 0):
        before = len(rows)
        _one_epoch(starts, ends, cumulative, min_sentences, targets, rows)
        epochs += 1
        if len(rows) == before and num_samples is not None:
            raise ValueError(
                f"no document has {min_sentences} or more sentences (each of at most "
                f"{LONG_SENTENCE_LEN} tokens when there are several), so no sample can be built"
            )
        if short_seq_ratio == 0 and num_samples is not None and len(rows) < 3 * num_samples:
            # no draws: every epoch is the same; add the remaining epochs at once
            per_epoch = len(rows) - before
            more = -(-(3 * num_samples - len(rows)) // per_epoch)
            rows.extend(rows[before:] * more)
    dtype = np.uint64 if sizes.size > np.iinfo(np.uint32).max else np.uint32
    table = np.array(rows, dtype=dtype).reshape(-1, 3)
    return table[_fisher_yates_order(table.shape[0], seed + 1)]


def _fisher_yates_order(count: int, seed: int) -> np.ndarray:
    """The row order after Megatron's swap loop ``for i = n-1..1: swap(i, mt64() % (i+1))``."""
    order = list(range(count))
    if count > 1:
        spans = np.arange(count, 1, -1, dtype=np.uint64)  # i + 1 for i = n-1 .. 1
        picks = (MT19937_64(seed).draw(count - 1) % spans).tolist()
        for i, j in zip(range(count - 1, 0, -1), picks):
            order[i], order[j] = order[j], order[i]
    return np.asarray(order, dtype=np.int64)
