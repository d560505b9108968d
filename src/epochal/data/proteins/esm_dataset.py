"""ESM-2 pretraining samples from protein clusters, sample for sample as BioNeMo's.

Semantics of bionemo-esm2's ``ESMMaskedResidueDataset`` (``esm2/data/dataset.py``,
NVIDIA/bionemo-framework at ``bf10c4d7``, the last commit that had it) with
bionemo-llm's ``apply_bert_pretraining_mask``. For ``EpochIndex(epoch, idx)``:

1. ``rng = numpy.random.default_rng([seed, epoch, idx])``;
2. a member of cluster ``idx`` is drawn (``rng.choice(cluster)``) and its sequence
   read from the protein dataset;
3. the sequence is tokenized *with* ``<cls>`` and ``<eos>`` (``n + 2`` tokens);
   a sequence of one-letter tokens (every stored protein) is cropped first and only
   its window tokenized, with the same draw and result, so a sample's memory does not
   grow with the protein's length;
4. a sequence longer than ``max_seq_length`` tokens is cropped to a window of
   ``max_seq_length`` starting at ``rng.integers(0, n + 2 - max_seq_length)``. The
   upper bound is exclusive (BioNeMo's), so the last window is never chosen: a
   cropped sample never ends with ``<eos>``, and it starts with ``<cls>`` only when
   the start is 0 (one chance in ``n + 2 - max_seq_length``). Shorter sequences are
   kept whole (``<cls> ... <eos>``) and draw nothing;
5. ``torch_seed = rng.integers(2**63 - 1)`` seeds a ``torch.Generator`` for the
   mask: one float32 uniform per token; a token that is not special (``<cls> <pad>
   <eos> <unk> <mask>``) is selected when its draw is below ``mask_prob``; draws
   below ``mask_prob * mask_token_prob`` become ``<mask>``, the next
   ``mask_prob * mask_random_prob`` a random token, the rest stay. Random tokens
   are drawn next from the same generator, uniformly from all 33 ids
   (``ALL_TOKENS``, specials included, as BioNeMo) or the 20 standard amino acids
   (``AMINO_ACIDS_ONLY``: ids 4-23).

A sample is ``{"text", "types", "attention_mask", "labels", "loss_mask",
"is_random"}``, each of shape ``(length,)``: ``text`` the masked ids (int64),
``labels`` the original ids where selected and ``-100`` elsewhere (int64),
``loss_mask`` bool, and BioNeMo's constant fields ``types`` (zeros),
``attention_mask`` (ones), ``is_random`` (zeros), all int64. Samples are not
padded (a collate function pads them).

Differences from BioNeMo: ``seed`` has no random default (runs must be
reproducible); an empty cluster is reported with the cluster's index, and
sequences made only of one-letter tokens are encoded through a lookup table (the
ids ``EsmTokenizer`` gives, ~10x faster); nothing is read from global random state.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.masking import apply_mlm_mask
from epochal.data.epochs.multi_epoch import as_epoch_index
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.data.proteins.sequences import only_characters

__all__ = ["ESMMaskedResidueDataset", "RandomMaskStrategy", "random_crop"]

_INT64_MAX = np.iinfo(np.int64).max


class RandomMaskStrategy(enum.StrEnum):
    """Which tokens the 10% "random token" replacements are drawn from (BioNeMo's enum)."""

    AMINO_ACIDS_ONLY = "amino_acids_only"
    """The 20 standard amino acids (ESM-2 ids 4-23)."""

    ALL_TOKENS = "all_tokens"
    """Every token of the vocabulary, special and non-canonical ones included."""


def random_crop(tokens: Any, crop_length: int, rng: np.random.Generator) -> Any:
    """Crop ``tokens`` to ``crop_length`` at a random start (BioNeMo's ``_random_crop``).

    Args:
        tokens: any sliceable sequence (a 1-D tensor, a string, ...).
        crop_length: the longest result.
        rng: draws the start, ``rng.integers(0, len(tokens) - crop_length)``
            (exclusive bound: the final window is never chosen), only when cropping.

    Returns:
        ``tokens`` itself when ``len(tokens) <= crop_length``, else the window.
    """
    if crop_length >= len(tokens):
        return tokens
    start = int(rng.integers(0, len(tokens) - crop_length))
    return tokens[start : start + crop_length]


def _probability(value: float, name: str) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


class ESMMaskedResidueDataset(Dataset):
    """ESM-2 masked-residue samples: one member of cluster ``idx``, cropped and masked per epoch.

    Args:
        protein_dataset: sequences by id (``protein_dataset[id] -> str``), e.g.
            :class:`~epochal.data.proteins.database.ProteinSQLiteDataset` or a dict.
        clusters: member ids per cluster (UniRef90 ids per UniRef50 cluster; for
            validation, one-id lists); a pandas Series of arrays works.
        seed: a non-negative integer, mixed with ``(epoch, idx)`` for every sample.
        max_seq_length: crop longer sequences to this many tokens, ``<cls>``/``<eos>``
            included (see the module docstring for the window).
        mask_prob: probability that a (non-special) token is selected for the loss.
        mask_token_prob: fraction of selected tokens replaced by ``<mask>``.
        mask_random_prob: fraction of selected tokens replaced by a random token.
        random_mask_strategy: where random tokens come from (:class:`RandomMaskStrategy`
            or its string value).
        tokenizer: an :class:`~epochal.data.indexed.tokenizer_esm.ESM2Tokenizer`
            (default: ESM-2's 33-token alphabet).

    Raises:
        ValueError: a negative seed, ``max_seq_length < 1``, a probability outside
            ``[0, 1]``, ``mask_token_prob + mask_random_prob > 1``, an unknown strategy,
            a tokenizer without a mask token; at access time an empty cluster (names it).
        KeyError: at access time, a member missing from ``protein_dataset``.
    """

    def __init__(
        self,
        protein_dataset: Mapping[str, str] | Any,
        clusters: Sequence[Sequence[str]],
        seed: int,
        max_seq_length: int = 1024,
        mask_prob: float = 0.15,
        mask_token_prob: float = 0.8,
        mask_random_prob: float = 0.1,
        random_mask_strategy: RandomMaskStrategy | str = RandomMaskStrategy.ALL_TOKENS,
        tokenizer: ESM2Tokenizer | None = None,
    ) -> None:
        self.protein_dataset = protein_dataset
        self.clusters = clusters
        self.seed = operator.index(seed)
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.max_seq_length = operator.index(max_seq_length)
        if self.max_seq_length < 1:
            raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
        self.mask_prob = _probability(mask_prob, "mask_prob")
        self.mask_token_prob = _probability(mask_token_prob, "mask_token_prob")
        self.mask_random_prob = _probability(mask_random_prob, "mask_random_prob")
        if self.mask_token_prob + self.mask_random_prob > 1.0:
            raise ValueError(
                "Sum of mask_random_prob and mask_token_prob must be <= 1.0, got "
                f"{self.mask_random_prob} + {self.mask_token_prob}"
            )
        try:
            self.random_mask_strategy = RandomMaskStrategy(random_mask_strategy)
        except ValueError:
            choices = ", ".join(s.value for s in RandomMaskStrategy)
            raise ValueError(
                f"random_mask_strategy must be one of {choices}, got {random_mask_strategy!r}"
            ) from None
        self.tokenizer = ESM2Tokenizer() if tokenizer is None else tokenizer
        if getattr(self.tokenizer, "mask", None) is None:
            raise ValueError("Tokenizer does not have a mask token.")
        self._prepare_tokenizer()

    def _prepare_tokenizer(self) -> None:
        # a pandas Series with the default index: its array (positional = label access, fast)
        index = getattr(self.clusters, "index", None)
        plain = type(index).__name__ == "RangeIndex" and (index.start, index.step) == (0, 1)
        self._members = self.clusters.to_numpy() if plain else self.clusters
        tok = self.tokenizer
        specials = sorted({tok.cls, tok.pad, tok.eos, tok.unk, tok.mask})
        self._special = torch.tensor(specials, dtype=torch.int64)
        if self.random_mask_strategy is RandomMaskStrategy.ALL_TOKENS:
            self._random = torch.arange(tok.vocab_size, dtype=torch.int64)
        else:  # BioNeMo's range(4, 24): the 20 standard amino acids of ESM-2's alphabet
            self._random = torch.arange(4, 24, dtype=torch.int64)
        # one-letter tokens by byte; -1: not a one-letter token (falls back to encode)
        self._lut = np.full(256, -1, dtype=np.int64)
        for token, token_id in tok.vocab.items():
            if len(token) == 1 and ord(token) < 128 and not token.isspace():
                self._lut[ord(token)] = token_id
        starts = {t[0] for t in tok.vocab if len(t) > 1}  # letters that may begin a longer token
        self._letters = bytes(b for b in np.flatnonzero(self._lut >= 0) if chr(b) not in starts)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_special", "_random", "_lut", "_letters", "_members"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._prepare_tokenizer()

    def __len__(self) -> int:
        """The number of clusters: one epoch."""
        return len(self.clusters)

    def tokenize(self, sequence: str) -> torch.Tensor:
        """``<cls>`` + the sequence's ids + ``<eos>``, as ``EsmTokenizer.encode`` (int64, 1-D)."""
        raw = sequence.encode("utf-8", errors="replace")
        ids = self._lut[np.frombuffer(raw, dtype=np.uint8)]
        if len(raw) == 0 or ids.min() < 0:  # not only one-letter tokens: the full tokenizer
            ids = np.asarray(self.tokenizer.encode(sequence), dtype=np.int64)
        out = np.empty(len(ids) + 2, dtype=np.int64)
        out[0], out[1:-1], out[-1] = self.tokenizer.cls, ids, self.tokenizer.eos
        return torch.from_numpy(out)

    def _cropped_tokens(self, sequence: str, rng: np.random.Generator) -> torch.Tensor:
        """``random_crop(self.tokenize(sequence), max_seq_length, rng)``, cropping the text first.

        A sequence of one-letter tokens (every protein the readers store) has one token
        per character, so the window is cut from the text and only it is tokenized:
        memory per sample is bounded by ``max_seq_length``, not the protein's length.
        Anything else is tokenized whole first (BioNeMo's order; same draws either way).
        """
        n, length = len(sequence), self.max_seq_length
        if n + 2 <= length or not only_characters(sequence, self._letters):
            return random_crop(self.tokenize(sequence), length, rng)
        start = int(rng.integers(0, n + 2 - length))  # random_crop's draw over n + 2 tokens
        # token p is <cls> for p = 0, else residue p - 1; the window never reaches <eos>
        body = sequence[max(start - 1, 0) : start - 1 + length]
        ids = self._lut[np.frombuffer(body.encode("ascii"), dtype=np.uint8)]
        if start == 0:
            ids = np.concatenate([[self.tokenizer.cls], ids])
        return torch.from_numpy(ids.astype(np.int64, copy=False))

    def _draw_member(self, index: EpochIndex) -> tuple[Any, np.random.Generator]:
        """The member drawn for ``index`` and the generator to draw the rest from (see
        :meth:`__getitem__` for the errors)."""
        key = as_epoch_index(index)
        if not 0 <= key.idx < len(self.clusters) or key.epoch < 0:
            raise IndexError(f"{key} out of range for {len(self.clusters)} clusters")
        rng = np.random.default_rng([self.seed, key.epoch, key.idx])
        members = self._members[key.idx]
        if not len(members):
            raise ValueError(f"Cluster {key.idx} is empty.")
        return members[int(rng.integers(0, len(members)))], rng  # = rng.choice(members)

    def member(self, index: EpochIndex) -> tuple[str, int]:
        """``(member id, cluster size)`` of the sample at ``index``: which member it reads."""
        member, _ = self._draw_member(index)
        return str(member), len(self._members[as_epoch_index(index).idx])

    def sample_identity(self, index: EpochIndex) -> dict[str, Any]:
        """``{"cluster": idx}``: the cluster of ``index`` (nothing drawn or read).

        With the seed and the epoch it decides the sample: the member (:meth:`member`),
        the crop and the masks.

        Raises:
            IndexError: ``idx`` or ``epoch`` out of range.
        """
        key = as_epoch_index(index)
        if not 0 <= key.idx < len(self.clusters) or key.epoch < 0:
            raise IndexError(f"{key} out of range for {len(self.clusters)} clusters")
        return {"cluster": key.idx}

    def __getitem__(self, index: EpochIndex) -> dict[str, torch.Tensor]:
        """The masked sample of cluster ``index.idx`` in epoch ``index.epoch``.

        Args:
            index: an :class:`~epochal.data.epochs.epoch_index.EpochIndex` (or an
                ``(epoch, idx)`` pair) with ``0 <= idx < len(self)``, ``epoch >= 0``.

        Returns:
            ``{"text", "types", "attention_mask", "labels", "loss_mask", "is_random"}``,
            each of shape ``(min(n + 2, max_seq_length),)`` for a member of ``n`` residues.

        Raises:
            IndexError: ``idx`` or ``epoch`` out of range.
            ValueError: the cluster is empty.
            KeyError: the member is not in the protein dataset.
        """
        member, rng = self._draw_member(index)
        tokens = self._cropped_tokens(self.protein_dataset[member], rng)
        torch_seed = int(rng.integers(_INT64_MAX))
        masked = apply_mlm_mask(
            tokens,
            torch.Generator().manual_seed(torch_seed),
            mask_token_id=self.tokenizer.mask,
            random_tokens=self._random,
            special_token_ids=self._special,
            mask_prob=self.mask_prob,
            mask_token_prob=self.mask_token_prob,
            random_token_prob=self.mask_random_prob,
            draw_dtype=torch.float32,
        )
        text = masked["tokens"]
        zeros = torch.zeros_like(text)
        return {
            "text": text,
            "types": zeros,
            "attention_mask": torch.ones_like(text),
            "labels": masked["labels"],
            "loss_mask": masked["loss_mask"],
            "is_random": zeros.clone(),
        }
