"""T5 span corruption that changes every epoch: ``SpanCorruptionDataset``.

For item ``idx`` in epoch ``epoch`` the token sequence is split into alternating runs
of kept and *noise* tokens, T5's ``random_spans_noise_mask`` (Raffel et al. 2020,
section 3.1.4; the original ``t5.data.preprocessors`` and Hugging Face's
``run_t5_mlm_flax``): ``round(length * noise_density)`` noise tokens in
``round(noise / mean_noise_span_length)`` spans, the span lengths and the kept-run
lengths each a uniformly random composition, the sequence starting with kept tokens.
Each noise span becomes one sentinel (``sentinel_ids[0]``, ``[1]``, ...) in the
encoder input; the target spells the spans out after their sentinels::

    tokens          a b c d e f g h i
    encoder input   a b <s0> e f <s1> i [EOS]
    labels          <s0> c d <s1> g h [EOS]
    decoder input   [START] <s0> c d <s1> g h          (labels shifted right)

All randomness comes from a local ``torch.Generator`` seeded with
``derive_seed(seed, epoch, idx)``: the same ``EpochIndex`` gives the same sample in
any process, and another epoch gives other spans. Samples are padded to fixed lengths
with Megatron's T5 keys, so :class:`~epochal.train.steps.T5TrainStep` trains on them
(BioNeMo's way: wrap the dataset in
:class:`~epochal.data.epochs.multi_epoch.MultiEpochDatasetResampler`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.masking import _as_token_tensor
from epochal.data.epochs.multi_epoch import MultiEpochDatasetWrapper
from epochal.data.epochs.permutation import derive_seed

__all__ = ["SpanCorruptionDataset", "random_spans_noise_mask"]


def _random_segmentation(
    num_items: int, num_segments: int, generator: torch.Generator
) -> torch.Tensor:
    """A uniformly random composition of ``num_items`` into ``num_segments`` positive parts."""
    cuts = torch.zeros(num_items - 1, dtype=torch.bool)
    cuts[: num_segments - 1] = True
    cuts = cuts[torch.randperm(num_items - 1, generator=generator)]
    segment = torch.cat([torch.zeros(1, dtype=torch.long), cuts.long().cumsum(0)])
    return torch.bincount(segment, minlength=num_segments)


def random_spans_noise_mask(
    length: int, noise_density: float, mean_noise_span_length: float, generator: torch.Generator
) -> torch.Tensor:
    """Bool ``[length]``: True on the noise tokens (see the module docstring).

    At least one noise and one kept token when ``length >= 2``; no noise below that.
    """
    if length < 2:
        return torch.zeros(length, dtype=torch.bool)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    num_spans = max(round(num_noise / mean_noise_span_length), 1)
    num_spans = min(num_spans, num_noise, length - num_noise)
    noise = _random_segmentation(num_noise, num_spans, generator)
    kept = _random_segmentation(length - num_noise, num_spans, generator)
    runs = torch.stack([kept, noise], dim=1).reshape(-1)  # kept, noise, kept, noise, ...
    is_noise = torch.arange(2 * num_spans) % 2 == 1
    return torch.repeat_interleave(is_noise, runs)


@dataclass(kw_only=True)
class SpanCorruptionDataset(MultiEpochDatasetWrapper[Any, dict[str, torch.Tensor]]):
    """Wrap a dataset of token sequences into T5 span-corruption samples keyed by ``EpochIndex``.

    ``ds[EpochIndex(epoch, idx)]`` corrupts ``dataset[idx]`` (a 1-D sequence of token
    ids, cut to ``encoder_length - 1`` tokens) with a generator seeded by
    ``(seed, epoch, idx)`` and returns int64 tensors with Megatron's T5 keys:
    ``text_enc`` / ``enc_mask`` ``[encoder_length]``, ``text_dec``, ``labels`` (-1 on
    padding), ``loss_mask``, ``dec_mask`` ``[decoder_length]``.

    Attributes:
        dataset: integer-indexed dataset of 1-D token sequences (positional argument).
        sentinel_ids: the sentinel ids, in order (``<extra_id_0>``, ...).
        eos_token_id: appended to the encoder input and the labels.
        decoder_start_token_id: the decoder's first input (T5: the pad id 0).
        pad_token_id: padding of ``text_enc`` / ``text_dec`` (masked by the masks).
        encoder_length / decoder_length: the fixed lengths (>= 2).
        noise_density: fraction of tokens corrupted, in (0, 1) (T5: 0.15).
        mean_noise_span_length: mean span length, >= 1 (T5: 3).
        seed: integer in ``[0, 2**64)``.

    Raises:
        ValueError: an invalid option (named); at access time, a sample that needs more
            sentinels than ``sentinel_ids`` or more than ``decoder_length`` decoder
            positions (the message names the item and the option).
    """

    sentinel_ids: Sequence[int]
    eos_token_id: int
    decoder_start_token_id: int = 0
    pad_token_id: int = 0
    encoder_length: int
    decoder_length: int
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    seed: int = 42

    def __post_init__(self) -> None:
        """Validate the options."""
        self.sentinel_ids = [operator.index(t) for t in self.sentinel_ids]
        if not self.sentinel_ids:
            raise ValueError("sentinel_ids is empty: T5 replaces each span by a sentinel")
        for name in ("eos_token_id", "decoder_start_token_id", "pad_token_id"):
            setattr(self, name, operator.index(getattr(self, name)))
        for name in ("encoder_length", "decoder_length"):
            value = operator.index(getattr(self, name))
            if value < 2:
                raise ValueError(f"{name} must be >= 2, got {value}")
        if not 0.0 < float(self.noise_density) < 1.0:
            raise ValueError(f"noise_density must be in (0, 1), got {self.noise_density}")
        if not float(self.mean_noise_span_length) >= 1.0:
            raise ValueError(
                f"mean_noise_span_length must be >= 1, got {self.mean_noise_span_length}"
            )
        derive_seed(self.seed)  # validates type and range

    def generator(self, index: EpochIndex) -> torch.Generator:
        """Return a fresh local generator seeded by ``derive_seed(seed, epoch, idx)``."""
        return torch.Generator().manual_seed(derive_seed(self.seed, index.epoch, index.idx))

    def apply_transform(self, sample: Any, index: EpochIndex) -> dict[str, torch.Tensor]:
        """Corrupt ``sample`` (the tokens of item ``index.idx``) for ``index.epoch``."""
        tokens = _as_token_tensor(sample, index).to(torch.int64)[: self.encoder_length - 1]
        noise = random_spans_noise_mask(
            len(tokens), self.noise_density, self.mean_noise_span_length, self.generator(index)
        )
        starts = noise & ~torch.cat([torch.zeros(1, dtype=torch.bool), noise[:-1]])
        num_spans = int(starts.sum())
        if num_spans > len(self.sentinel_ids):
            raise ValueError(
                f"item {index.idx}: {num_spans} noise spans but {len(self.sentinel_ids)} "
                "sentinel_ids; give more sentinels or a shorter encoder_length"
            )
        sentinels = torch.tensor(self.sentinel_ids[:num_spans], dtype=torch.int64)
        span_number = starts.long().cumsum(0) - 1  # which span each noise token is in
        # encoder: kept tokens, and each span's first token replaced by its sentinel
        encoder = torch.where(starts, sentinels[span_number.clamp(min=0)], tokens)[~noise | starts]
        # labels: each span's sentinel, then its tokens
        pieces = []
        for k in range(num_spans):
            pieces += [sentinels[k : k + 1], tokens[noise & (span_number == k)]]
        eos = torch.tensor([self.eos_token_id], dtype=torch.int64)
        encoder = torch.cat([encoder, eos])
        labels = torch.cat([*pieces, eos])
        if len(labels) > self.decoder_length:
            raise ValueError(
                f"item {index.idx}: the target needs {len(labels)} positions ({num_spans} "
                f"sentinels, {int(noise.sum())} noise tokens, [EOS]), more than "
                f"decoder_length={self.decoder_length}"
            )
        decoder = torch.cat([torch.tensor([self.decoder_start_token_id]), labels[:-1]])
        return {
            "text_enc": _pad(encoder, self.encoder_length, self.pad_token_id),
            "enc_mask": _pad(torch.ones_like(encoder), self.encoder_length, 0),
            "text_dec": _pad(decoder, self.decoder_length, self.pad_token_id),
            "labels": _pad(labels, self.decoder_length, -1),
            "loss_mask": _pad(torch.ones_like(labels), self.decoder_length, 0),
            "dec_mask": _pad(torch.ones_like(decoder), self.decoder_length, 0),
        }


def _pad(values: torch.Tensor, length: int, fill: int) -> torch.Tensor:
    out = torch.full((length,), fill, dtype=torch.int64)
    out[: len(values)] = values
    return out
