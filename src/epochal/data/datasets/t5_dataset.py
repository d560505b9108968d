"""T5Dataset: span-corruption samples of sentence runs, sample for sample as Megatron-Core.

``T5Dataset(indexed, document_ids, num_samples, seq_length, seq_length_decoder, seed,
tokenizer=...)`` returns the samples of Megatron-Core 0.16.1's
``T5MaskedWordPieceDataset`` for the same files, seed, tokenizer and options. It
shares :class:`~epochal.data.datasets.bert_dataset.BERTDataset`'s sample index (runs of
whole sentences, ``seq_length - 2`` target tokens, one sentence at least), its caches
and its per-sample ``numpy.random.RandomState((seed + idx) % 2**32)``; per sample the
sentences are concatenated and cut to the target length, N-grams are chosen as
Megatron's masked datasets choose them (:func:`~epochal.data.datasets.masked_lm.create_masked_spans`;
every chosen token becomes ``[MASK]``, with no draw), and each masked N-gram (span)
is replaced by the next sentinel (``<extra_id_0>``, ``<extra_id_1>``, ...)::

    encoder input   a b <extra_id_0> e <extra_id_1> h ...        (pad to seq_length)
    decoder input   [BOS] <extra_id_0> c d <extra_id_1> f g ...  (pad to seq_length_decoder)
    labels          <extra_id_0> c d <extra_id_1> f g ... [EOS]   (-1 on padding)

Each sample is a dict with Megatron's keys and types:

- ``text_enc``: int64 ``[seq_length]``, padding 0;
- ``text_dec``: int64 ``[seq_length_decoder]``, padding 0;
- ``labels``: int64 ``[seq_length_decoder]``, ``-1`` on padding (0 where it equals the pad id);
- ``loss_mask``: int64 ``[seq_length_decoder]``, 1 on the decoder's tokens;
- ``truncated``: int, 1 when the sentences had to be cut;
- ``enc_mask`` / ``dec_mask``: int64 ``[seq_length]`` / ``[seq_length_decoder]``, 1 on
  tokens, 0 on padding (the models' padding masks).

Where Megatron asserts, this raises :class:`ValueError` naming the option: a tokenizer
without sentinels (``additional_special_tokens_ids``) or ``bos``/``eos``; a
``seq_length_decoder`` shorter than a full sample's smallest need (checked up front:
``[BOS]``, one sentinel and every masked token); a sample whose spans need more decoder
positions than ``seq_length_decoder`` or more sentinels than the tokenizer has.

As with BERT, numpy's global generator is never read (the permutation N-gram sizes come
from ``RandomState([seed, idx, PERMUTATION_SEED_WORD])``), ``dataset[EpochIndex(e, i)]``
is sample ``i``, and later epochs of the index get fresh spans because every sample
index has its own generator.
"""

from __future__ import annotations

import math
import os
from collections import deque
from typing import Any

import numpy as np

from epochal.data.datasets.bert_dataset import PERMUTATION_SEED_WORD, BERTDataset
from epochal.data.datasets.masked_lm import MaskingOptions, create_masked_spans
from epochal.data.epochs.epoch_index import EpochIndex

__all__ = ["T5Dataset", "sentinel_ids"]


def sentinel_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's sentinel ids (``additional_special_tokens_ids``), in order.

    Raises:
        ValueError: the tokenizer has none, or lacks ``bos`` / ``eos`` (the message says
            how to get them: ``vocab_extra_ids`` / ``--vocab-extra-ids``).
    """
    try:
        ids = [int(i) for i in tokenizer.additional_special_tokens_ids]
    except (AttributeError, NotImplementedError, TypeError):
        ids = []
    name = type(tokenizer).__name__
    if not ids:
        raise ValueError(
            f"tokenizer: {name} has no sentinel tokens (additional_special_tokens_ids); T5 "
            "samples replace each masked span by <extra_id_N>: build the tokenizer with "
            "vocab_extra_ids > 0 (epochal preprocess / Megatron: --vocab-extra-ids 100)"
        )
    for attribute in ("bos", "eos"):
        if getattr(tokenizer, attribute, None) is None:
            raise ValueError(
                f"tokenizer: {name} has no {attribute} id; T5 samples start the decoder "
                "with [BOS] and end the labels with [EOS]"
            )
    return ids


class T5Dataset(BERTDataset):
    """Megatron-Core's ``T5MaskedWordPieceDataset`` over any indexed dataset (duck-typed).

    Args:
        indexed_dataset, document_ids, num_samples, seed, split, cache_dir, group: as
            :class:`~epochal.data.datasets.bert_dataset.BERTDataset`.
        seq_length: encoder tokens per sample (>= 5); the sample index targets
            ``seq_length - 2`` corpus tokens.
        seq_length_decoder: decoder tokens per sample (Megatron's
            ``sequence_length_decoder``).
        tokenizer: a WordPiece tokenizer with ``cls``, ``sep``, ``mask``, ``pad``,
            ``bos``, ``eos``, ``inv_vocab`` and sentinels
            (``additional_special_tokens_ids``).
        masking: the masking options.
        short_sequence_probability: probability of a shorter target length.

    Raises:
        ValueError: as BERTDataset, a tokenizer without sentinels/bos/eos, or a
            ``seq_length_decoder`` too short (see the module docstring).
    """

    RESERVED_TOKENS = 2  # Megatron: "Account for the single <bos> and single <eos> token ids"

    def __init__(
        self,
        indexed_dataset: Any,
        document_ids: np.ndarray | None,
        num_samples: int | None,
        seq_length: int,
        seq_length_decoder: int,
        seed: int,
        *,
        tokenizer: Any,
        masking: MaskingOptions,
        short_sequence_probability: float = 0.1,
        split: str = "train",
        cache_dir: str | os.PathLike | None = None,
        group: Any = None,
    ) -> None:
        self.sentinels = sentinel_ids(tokenizer)
        self.bos, self.eos = int(tokenizer.bos), int(tokenizer.eos)
        check_decoder_length(seq_length, seq_length_decoder, masking.probability)
        self.seq_length_decoder = int(seq_length_decoder)
        super().__init__(
            indexed_dataset,
            document_ids,
            num_samples,
            seq_length,
            seed,
            tokenizer=tokenizer,
            masking=masking,
            short_sequence_probability=short_sequence_probability,
            classification_head=False,
            split=split,
            cache_dir=cache_dir,
            group=group,
        )

    def __getitem__(self, idx: int | EpochIndex) -> dict[str, Any]:
        """Return sample ``idx`` (see the module docstring for the keys).

        Raises:
            IndexError: ``idx`` out of range. TypeError: not an int or ``EpochIndex``.
            ValueError: the sample needs more decoder positions or sentinels than there are.
        """
        idx = self._index(idx)
        begin, end, target = (int(v) for v in self.sample_index[idx])
        tokens = [t for i in range(begin, end) for t in self.dataset.get(i).tolist()]
        state, permutation_state = self._generators()
        state.seed((self.seed + idx) % 2**32)  # Megatron: RandomState(seed=(seed + idx) % 2**32)
        truncated = len(tokens) > target
        tokens = tokens[:target]
        if self.masking.do_permutation:
            permutation_state.seed([self.seed, idx, PERMUTATION_SEED_WORD])
        tokens, spans = create_masked_spans(
            tokens, target, state, self.vocab, self.masking, permutation_state
        )
        if len(spans) > len(self.sentinels):
            raise ValueError(
                f"{self.name}: sample {idx} masks {len(spans)} spans but the tokenizer has "
                f"{len(self.sentinels)} sentinels; use more vocab_extra_ids"
            )

        sentinels = deque(self.sentinels)
        encoder, decoder_in, decoder_out = [], [self.bos], []
        start = 0
        for positions, labels in spans:
            sentinel = sentinels.popleft()
            encoder.extend(tokens[start : positions[0]])
            encoder.append(sentinel)
            decoder_in.append(sentinel)
            decoder_in.extend(labels)
            decoder_out.append(sentinel)
            decoder_out.extend(labels)
            start = positions[-1] + 1
        encoder.extend(tokens[start:])
        decoder_out.append(self.eos)
        if len(decoder_in) > self.seq_length_decoder:
            raise ValueError(
                f"{self.name}: sample {idx} needs {len(decoder_in)} decoder tokens ([BOS], "
                f"{len(spans)} sentinels and the masked tokens), more than "
                f"seq_length_decoder={self.seq_length_decoder}; raise seq_length_decoder"
            )

        pad = self.pad_token_id
        enc_len, dec_len = self.seq_length, self.seq_length_decoder
        text_enc = np.full(enc_len, pad, dtype=np.int64)
        text_enc[: len(encoder)] = encoder
        text_dec = np.full(dec_len, pad, dtype=np.int64)
        text_dec[: len(decoder_in)] = decoder_in
        enc_mask = np.ones(enc_len, dtype=np.int64)
        enc_mask[text_enc == pad] = 0
        dec_mask = np.ones(dec_len, dtype=np.int64)
        dec_mask[text_dec == pad] = 0
        labels = np.full(dec_len, -1, dtype=np.int64)
        labels[: len(decoder_out)] = decoder_out
        loss_mask = np.zeros(dec_len, dtype=np.int64)
        loss_mask[: len(decoder_in)] = 1
        text_enc[text_enc == pad] = 0
        text_dec[text_dec == pad] = 0
        labels[labels == pad] = 0
        return {
            "text_enc": text_enc,
            "text_dec": text_dec,
            "labels": labels,
            "loss_mask": loss_mask,
            "truncated": int(truncated),
            "enc_mask": enc_mask,
            "dec_mask": dec_mask,
        }

    def __repr__(self) -> str:
        return (
            f"T5Dataset({self.name!r}, split={self.split}, samples={len(self)}, "
            f"seq_length={self.seq_length}, seq_length_decoder={self.seq_length_decoder}, "
            f"seed={self.seed})"
        )


def check_decoder_length(seq_length: int, seq_length_decoder: Any, probability: float) -> None:
    """Refuse a ``seq_length_decoder`` that cannot hold a full-length sample's masked tokens.

    A sample of ``seq_length - 2`` corpus tokens masks up to ``floor(probability *
    (seq_length - 2))`` of them; the decoder holds ``[BOS]``, a sentinel per span and
    those tokens, so it needs at least ``2 + that`` positions (all of them in one span).

    Raises:
        ValueError: naming ``seq_length_decoder`` and the length needed.
    """
    if isinstance(seq_length_decoder, bool) or not isinstance(seq_length_decoder, int | np.integer):
        raise ValueError(f"seq_length_decoder must be an int, got {seq_length_decoder!r}")
    most = math.floor(probability * (seq_length - 2))
    needed = 2 + most
    if seq_length_decoder < needed:
        raise ValueError(
            f"seq_length_decoder={seq_length_decoder} is too short: a sample of seq_length="
            f"{seq_length} masks up to {most} tokens (masking_probability={probability}), so "
            f"the decoder needs at least {needed} positions ([BOS], a sentinel and the masked "
            f"tokens; more with several spans). Megatron's T5 uses 128 for seq_length 512"
        )
