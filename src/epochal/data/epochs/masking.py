"""BERT/ESM-style masked-token pretraining samples that change every epoch: ``MaskedTokenDataset``.

For item ``idx`` in epoch ``epoch`` every token is independently *selected* with
probability ``mask_prob`` (15% by default; special tokens never). Of the selected
tokens, a fraction ``mask_token_prob`` (80%) becomes the mask token,
``random_token_prob`` (10%) a token drawn uniformly from ``random_tokens``, and the
rest (10%) stay unchanged. Labels hold the original token where selected and
``-100`` elsewhere (the ``ignore_index`` of ``torch.nn.functional.cross_entropy``).

All randomness comes from a local ``torch.Generator`` seeded with
``derive_seed(seed, epoch, idx)``: the same ``EpochIndex`` gives the same sample in
any process, and a different epoch gives a different mask. The draws follow
BioNeMo's ``apply_bert_pretraining_mask`` (one uniform per token decides both
selection and replacement kind; the random tokens are drawn next from the same
generator).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.multi_epoch import MultiEpochDatasetWrapper
from epochal.data.epochs.permutation import derive_seed

__all__ = ["IGNORE_INDEX", "MaskedTokenDataset", "apply_mlm_mask"]

IGNORE_INDEX = -100
"""Label of tokens that are not predicted (PyTorch's cross-entropy ``ignore_index``)."""


def apply_mlm_mask(
    tokens: torch.Tensor,
    generator: torch.Generator,
    *,
    mask_token_id: int,
    random_tokens: torch.Tensor,
    special_token_ids: torch.Tensor,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    random_token_prob: float = 0.1,
    draw_dtype: torch.dtype = torch.float64,
) -> dict[str, torch.Tensor]:
    """Mask a 1-D token tensor for masked-language-model pretraining.

    Args:
        tokens: ``int64`` tensor of shape ``(seq_len,)``.
        generator: the local generator all draws come from (its state advances).
        mask_token_id: id that replaces ``mask_token_prob`` of the selected tokens.
        random_tokens: ``int64`` tensor of candidate ids for random replacement.
        special_token_ids: ``int64`` tensor of ids that are never selected.
        mask_prob: probability that a (non-special) token is selected, in ``[0, 1]``.
        mask_token_prob: fraction of selected tokens replaced by the mask token.
        random_token_prob: fraction of selected tokens replaced by a random token.
        draw_dtype: dtype of the per-token uniform draws; ``torch.float32`` (the
            thresholds then compare in float32) gives BioNeMo's masks bit for bit.

    Returns:
        ``{"tokens": int64 (seq_len,), "labels": int64 (seq_len,), "loss_mask": bool (seq_len,)}``;
        ``labels`` is the original token where ``loss_mask`` is true, ``-100`` elsewhere.
    """
    # The draws come from ``generator``; the rest runs on numpy views (a few times faster
    # than torch for one sample's few hundred tokens). Python-float thresholds compare in
    # the draws' dtype in numpy as in torch.
    draws = torch.rand(tokens.shape, generator=generator, dtype=draw_dtype).numpy()
    ids = tokens.numpy()
    selected = draws < mask_prob
    if special_token_ids.numel():
        selected &= ~np.isin(ids, special_token_ids.numpy())
    stop_mask = mask_prob * mask_token_prob
    stop_random = mask_prob * (mask_token_prob + random_token_prob)
    to_mask = selected & (draws < stop_mask)
    to_random = selected & (draws >= stop_mask) & (draws < stop_random)
    masked = ids.copy()
    masked[to_mask] = mask_token_id
    num_random = int(np.count_nonzero(to_random))
    if num_random:
        picks = torch.randint(len(random_tokens), (num_random,), generator=generator)
        masked[to_random] = random_tokens.numpy()[picks.numpy()]
    labels = np.where(selected, ids, IGNORE_INDEX).astype(ids.dtype, copy=False)
    masked, labels, selected = (torch.from_numpy(a) for a in (masked, labels, selected))
    return {"tokens": masked, "labels": labels, "loss_mask": selected}


def _as_token_tensor(sample: Any, index: EpochIndex) -> torch.Tensor:
    """Return ``sample`` as a 1-D integer tensor, or raise ``ValueError`` naming the item."""
    if isinstance(sample, torch.Tensor):
        tokens = sample
    else:
        try:
            arr = np.asarray(sample)
        except (TypeError, ValueError) as err:
            raise ValueError(f"item {index.idx} is not a sequence of token ids: {err}") from err
        if arr.ndim == 1 and arr.size == 0:
            arr = arr.astype(np.int64)
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(
                f"item {index.idx} must be a 1-D integer sequence of token ids, got dtype {arr.dtype}"
            )
        tokens = torch.from_numpy(arr.astype(np.int64))
    if tokens.ndim != 1 or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
        raise ValueError(
            f"item {index.idx} must be a 1-D integer sequence of token ids, "
            f"got shape {tuple(tokens.shape)} dtype {tokens.dtype}"
        )
    if tokens.dtype == torch.bool:
        raise ValueError(f"item {index.idx} must hold integer token ids, got dtype torch.bool")
    return tokens


def _probability(value: Any, name: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


@dataclass(kw_only=True)
class MaskedTokenDataset(MultiEpochDatasetWrapper[Any, dict[str, torch.Tensor]]):
    """Wrap a dataset of token sequences into masked-LM samples keyed by ``EpochIndex``.

    ``ds[EpochIndex(epoch, idx)]`` masks ``dataset[idx]`` (a 1-D sequence of token ids:
    list, numpy array or tensor) with a generator seeded by ``(seed, epoch, idx)`` and
    returns ``{"tokens", "labels", "loss_mask"}`` (see :func:`apply_mlm_mask`). Wrap it in
    :class:`~epochal.data.multi_epoch.MultiEpochDatasetResampler` to index by global
    sample number.

    Attributes:
        dataset: integer-indexed dataset of 1-D token sequences (positional argument).
        mask_token_id: id of the mask token.
        random_tokens: ids a random replacement is drawn from (e.g. ``range(4, 24)``
            for ESM-2's amino acids); must be non-empty when ``random_token_prob > 0``.
        special_token_ids: ids never selected (CLS, EOS, PAD, ...).
        mask_prob: selection probability per token (default 0.15).
        mask_token_prob: fraction of selected tokens set to the mask token (default 0.8).
        random_token_prob: fraction of selected tokens set to a random token (default 0.1).
        seed: integer in ``[0, 2**64)``.

    Raises:
        ValueError: a probability outside ``[0, 1]``, ``mask_token_prob +
            random_token_prob > 1``, empty ``random_tokens``, a bad seed; at access time,
            a sample that is not a 1-D integer sequence (the message names the index).
    """

    mask_token_id: int
    random_tokens: Sequence[int]
    special_token_ids: Sequence[int] = ()
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    seed: int = 42
    _random: torch.Tensor = field(init=False, repr=False)
    _special: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Validate the options and precompute the id tensors."""
        self.mask_prob = _probability(self.mask_prob, "mask_prob")
        self.mask_token_prob = _probability(self.mask_token_prob, "mask_token_prob")
        self.random_token_prob = _probability(self.random_token_prob, "random_token_prob")
        if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-12:
            raise ValueError(
                "mask_token_prob + random_token_prob must be <= 1, got "
                f"{self.mask_token_prob} + {self.random_token_prob}"
            )
        self.mask_token_id = operator.index(self.mask_token_id)
        derive_seed(self.seed)  # validates type and range
        self._random = torch.as_tensor(list(self.random_tokens), dtype=torch.int64)
        if self._random.numel() == 0 and self.random_token_prob > 0:
            raise ValueError("random_tokens is empty but random_token_prob > 0")
        self._special = torch.as_tensor(list(self.special_token_ids), dtype=torch.int64)

    def generator(self, index: EpochIndex) -> torch.Generator:
        """Return a fresh local generator seeded by ``derive_seed(seed, epoch, idx)``."""
        return torch.Generator().manual_seed(derive_seed(self.seed, index.epoch, index.idx))

    def apply_transform(self, sample: Any, index: EpochIndex) -> dict[str, torch.Tensor]:
        """Mask ``sample`` (the tokens of item ``index.idx``) for ``index.epoch``."""
        tokens = _as_token_tensor(sample, index)
        return apply_mlm_mask(
            tokens.to(torch.int64),
            self.generator(index),
            mask_token_id=self.mask_token_id,
            random_tokens=self._random,
            special_token_ids=self._special,
            mask_prob=self.mask_prob,
            mask_token_prob=self.mask_token_prob,
            random_token_prob=self.random_token_prob,
        )
