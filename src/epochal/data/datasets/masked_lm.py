"""Masked-LM predictions over WordPiece ids, draw for draw as Megatron-Core's masked datasets.

:func:`create_masked_lm_predictions` is ``MaskedWordPieceDataset._create_masked_lm_predictions``
with ``BERTMaskedWordPieceDataset._get_token_mask`` of Megatron-Core 0.16.1: the same
candidates (whole words with ``do_full_word``), the same N-gram choice and the same
calls on the same ``numpy.random.RandomState``, hence the same masks for the same state.
:func:`create_masked_spans` is the same with ``T5MaskedWordPieceDataset._get_token_mask``
(every chosen token becomes ``[MASK]``, with no draw) and returns the masked N-grams
as spans, which T5 replaces by sentinels.

One difference, on purpose: Megatron draws the N of each *permutation* candidate from
numpy's **global** generator (``numpy.random.choice``), which makes its samples depend
on process state. Here it comes from ``permutation_state``, a second ``RandomState``
the caller seeds from the sample index; seeding the global generator the same way
before Megatron's ``__getitem__`` gives Megatron's samples.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class MaskingOptions:
    """Megatron's masking fields (see :class:`~epochal.data.datasets.bert_builder.BERTDatasetConfig`)."""

    probability: float
    max_ngram: int
    do_full_word: bool
    do_permutation: bool
    use_longer_ngrams: bool
    use_geometric_distribution: bool


class WordPieceVocabulary:
    """What masking needs from a tokenizer: special ids, ``##`` continuations, random ids.

    Args:
        tokenizer: has ``cls``, ``sep``, ``mask`` (ints) and ``inv_vocab`` (id -> piece).

    Raises:
        ValueError: ``tokenizer`` lacks one of them (the message names it).
    """

    def __init__(self, tokenizer: object) -> None:
        missing = []
        for name in ("cls", "sep", "mask", "inv_vocab"):
            try:
                value = getattr(tokenizer, name)
            except (AttributeError, NotImplementedError):
                value = None
            if value is None:
                missing.append(name)
        if missing:
            raise ValueError(
                f"tokenizer: {type(tokenizer).__name__} has no {', '.join(missing)}; BERT samples "
                "need a WordPiece tokenizer with [CLS], [SEP], [MASK] and inv_vocab "
                "(e.g. BertWordPieceLowerCase)"
            )
        self.cls = int(tokenizer.cls)
        self.sep = int(tokenizer.sep)
        self.mask = int(tokenizer.mask)
        inv_vocab = tokenizer.inv_vocab
        # Megatron draws random replacements from list(inv_vocab.keys()), in that order
        self.token_lookup = np.asarray(list(inv_vocab.keys()), dtype=np.int64)
        top = int(self.token_lookup.max()) + 1 if self.token_lookup.size else 0
        is_continuation = [False] * max(top, self.cls + 1, self.sep + 1)
        for token_id, piece in inv_vocab.items():
            is_continuation[int(token_id)] = str(piece).startswith("##")
        self.is_continuation = is_continuation


def _candidates(
    token_ids: list[int], vocab: WordPieceVocabulary, do_full_word: bool
) -> list[list[int]]:
    """Positions grouped into masking candidates (whole words with ``do_full_word``)."""
    candidates: list[list[int]] = []
    continuation = vocab.is_continuation
    cls, sep = vocab.cls, vocab.sep
    for i, token_id in enumerate(token_ids):
        if token_id == cls or token_id == sep:
            continue
        if continuation[token_id] and do_full_word and candidates:
            candidates[-1].append(i)
        else:
            candidates.append([i])
    return candidates


@lru_cache(maxsize=64)
def _ngram_cdf(max_ngram: int, use_longer_ngrams: bool) -> list[float]:
    """The cumulative N-gram probabilities Megatron's ``RandomState.choice`` searches.

    ``state.choice(arange(1, max_ngram + 1), p=p)`` is ``1 + searchsorted(cdf,
    state.random_sample(), "right")`` with ``cdf = p.cumsum() / p.cumsum()[-1]``: the
    same draw and the same result, without ``choice``'s per-call checks.
    """
    ngram_nvals = np.arange(max_ngram, dtype=np.int64) + 1
    nprobs = 1.0 / ngram_nvals
    nprobs = nprobs / nprobs.sum(keepdims=True)
    if use_longer_ngrams:
        nprobs = nprobs[::-1]
    # every candidate has max_ngram N-grams (those near the end are shorter), so Megatron's
    # per-candidate probabilities are always the full ones
    p = nprobs / nprobs.sum(keepdims=True)
    cdf = p.cumsum()
    cdf /= cdf[-1]
    return cdf.tolist()


def _draw_n(cdf: list[float], state: np.random.RandomState) -> int:
    return 1 + bisect_right(cdf, state.random_sample())


def _token_mask(vocab: WordPieceVocabulary, state: np.random.RandomState) -> int | None:
    """80% [MASK], 10% a random vocabulary id, 10% unchanged (``None``)."""
    if state.random() < 0.8:
        return vocab.mask
    if state.random() >= 0.5:
        return int(vocab.token_lookup[state.randint(0, len(vocab.token_lookup))])
    return None


def _ngram(candidates: list[list[int]], start: int, n: int) -> list[int]:
    return [index for candidate in candidates[start : start + n] for index in candidate]


def _fit_ngram(
    candidates: list[list[int]], start: int, n: int, limit: float, used: int
) -> list[int] | None:
    """Megatron's shrinking loop: the longest ``<= n``-gram at ``start`` with ``used + len <= limit``."""
    while True:
        indices = _ngram(candidates, start, n)
        n -= 1
        if limit >= used + len(indices):
            return indices
        if n == 0:
            return None


def create_masked_lm_predictions(
    token_ids: list[int],
    target_sequence_length: int,
    state: np.random.RandomState,
    vocab: WordPieceVocabulary,
    options: MaskingOptions,
    permutation_state: np.random.RandomState | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Mask (and with ``do_permutation`` shuffle) N-grams of ``token_ids`` (BERT: 80/10/10).

    Args:
        token_ids: ``[CLS] A [SEP] (B [SEP])`` ids.
        target_sequence_length: the sample's target length (bounds the masked count).
        state: the sample's generator (Megatron: ``RandomState(seed + idx)``), advanced
            exactly as Megatron-Core advances it.
        vocab: the tokenizer's special ids and pieces.
        options: the masking options.
        permutation_state: generator of the permutation N-gram sizes (needed with
            ``options.do_permutation``; see the module docstring).

    Returns:
        ``(masked ids, masked positions ascending, their original ids)``.
    """
    masked, positions_and_labels, _ = _mask(
        token_ids, target_sequence_length, state, vocab, options, permutation_state, False
    )
    return (
        masked,
        [position for position, _ in positions_and_labels],
        [label for _, label in positions_and_labels],
    )


def create_masked_spans(
    token_ids: list[int],
    target_sequence_length: int,
    state: np.random.RandomState,
    vocab: WordPieceVocabulary,
    options: MaskingOptions,
    permutation_state: np.random.RandomState | None = None,
) -> tuple[list[int], list[tuple[list[int], list[int]]]]:
    """Mask N-grams of ``token_ids`` with ``[MASK]`` only (T5); same draws as Megatron-Core's T5.

    Arguments as :func:`create_masked_lm_predictions`.

    Returns:
        ``(masked ids, spans)``: ``spans`` are ``(positions, original ids)`` of each
        masked N-gram, ordered by first position (permuted N-grams are not spans).
    """
    masked, _, spans = _mask(
        token_ids, target_sequence_length, state, vocab, options, permutation_state, True
    )
    return masked, spans


def _mask(
    token_ids: list[int],
    target_sequence_length: int,
    state: np.random.RandomState,
    vocab: WordPieceVocabulary,
    options: MaskingOptions,
    permutation_state: np.random.RandomState | None,
    always_mask: bool,
) -> tuple[list[int], list[tuple[int, int]], list[tuple[list[int], list[int]]]]:
    """The shared algorithm: ``(masked ids, sorted (position, label) pairs, sorted spans)``."""
    candidates = _candidates(token_ids, vocab, options.do_full_word)
    n_maskings = min(
        options.probability * target_sequence_length,
        max(1, int(round(len(token_ids) * options.probability))),
    )
    cdf = _ngram_cdf(options.max_ngram, options.use_longer_ngrams)
    order = np.arange(len(candidates))
    state.shuffle(order)

    masked = list(token_ids)
    positions_and_labels: list[tuple[int, int]] = []
    spans: list[tuple[list[int], list[int]]] = []
    masked_indices: set[int] = set()
    for start in order.tolist():
        if len(positions_and_labels) >= n_maskings:
            break
        if options.use_geometric_distribution:
            n = min(state.geometric(0.2), options.max_ngram)
        else:
            n = _draw_n(cdf, state)
        indices = _fit_ngram(candidates, start, int(n), n_maskings, len(positions_and_labels))
        if indices is None or any(index in masked_indices for index in indices):
            continue
        for index in indices:
            masked_indices.add(index)
            replacement = vocab.mask if always_mask else _token_mask(vocab, state)
            masked[index] = token_ids[index] if replacement is None else replacement
            positions_and_labels.append((index, token_ids[index]))
        spans.append((indices, [token_ids[index] for index in indices]))

    state.shuffle(order)

    if options.do_permutation:
        if permutation_state is None:
            raise ValueError("masking_do_permutation needs a permutation_state generator")
        permuted: set[int] = set()
        for start in order.tolist():
            if len(permuted) >= n_maskings:
                break
            n = _draw_n(cdf, permutation_state)
            indices = _fit_ngram(candidates, start, int(n), n_maskings, len(permuted))
            if indices is None or any(i in masked_indices or i in permuted for i in indices):
                continue
            permuted.update(indices)
        sources = sorted(permuted)
        targets = list(sources)
        state.shuffle(targets)
        before = list(masked)
        for index, source in zip(sources, targets):
            masked[index] = before[source]
            positions_and_labels.append((index, before[index]))

    positions_and_labels.sort(key=lambda pair: pair[0])
    spans.sort(key=lambda span: span[0][0])
    return masked, positions_and_labels, spans
