"""SpanCorruptionDataset: T5 spans that change every epoch, deterministic per EpochIndex."""

from __future__ import annotations

import pytest
import torch

from epochal.data import EpochIndex, MultiEpochDatasetResampler, SpanCorruptionDataset
from epochal.data.epochs.span_corruption import random_spans_noise_mask
from epochal.testing import (
    assert_dataset_compatible_with_megatron,
    assert_dataset_elements_not_equal,
)

SENTINELS = list(range(900, 1000))
EOS, START = 1, 0


def sequences(n: int = 20) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(
            10, 800, (int(torch.randint(8, 60, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in range(n)
    ]


def dataset(**kw) -> SpanCorruptionDataset:
    values = dict(
        sentinel_ids=SENTINELS, eos_token_id=EOS, encoder_length=64, decoder_length=32, seed=3
    )
    values.update(kw)
    return SpanCorruptionDataset(sequences(), **values)


def reconstruct(sample: dict) -> list[int]:
    """The original tokens from the encoder input and the labels (sentinels joined)."""
    enc = sample["text_enc"][sample["enc_mask"].bool()].tolist()[:-1]  # drop EOS
    labels = sample["labels"][sample["loss_mask"].bool()].tolist()[:-1]
    spans: dict[int, list[int]] = {}
    current = None
    for t in labels:
        if t in SENTINELS:
            current = t
            spans[t] = []
        else:
            spans[current].append(t)
    out: list[int] = []
    for t in enc:
        out += spans[t] if t in SENTINELS else [t]
    return out


def test_samples_round_trip_and_follow_the_layout() -> None:
    ds = dataset()
    for i, tokens in enumerate(sequences()):
        s = ds[EpochIndex(0, i)]
        assert reconstruct(s) == tokens[:63]
        enc = s["text_enc"][s["enc_mask"].bool()]
        labels = s["labels"][s["loss_mask"].bool()]
        dec = s["text_dec"][s["dec_mask"].bool()]
        assert enc[-1] == EOS and labels[-1] == EOS and dec[0] == START
        assert torch.equal(dec[1:], labels[:-1])  # decoder input = labels shifted right
        n_spans = int(torch.isin(enc, torch.tensor(SENTINELS)).sum())
        assert n_spans >= 1 and labels[0] == SENTINELS[0]
        noise = len(labels) - 1 - n_spans
        assert noise == min(max(round(min(len(tokens), 63) * 0.15), 1), min(len(tokens), 63) - 1)
        assert (s["labels"][~s["loss_mask"].bool()] == -1).all()


def test_deterministic_per_index_and_fresh_every_epoch() -> None:
    ds = dataset()
    # (a short item with one span always ends with it, as in T5: take items of several spans)
    long_items = [i for i, t in enumerate(sequences()) if len(t) >= 30][:4]
    assert len(long_items) == 4
    for i in long_items:
        assert_dataset_compatible_with_megatron(ds, EpochIndex(0, i))
        assert_dataset_elements_not_equal(ds, EpochIndex(0, i), EpochIndex(1, i))
    resampled = MultiEpochDatasetResampler(ds, num_epochs=3, seed=7)
    assert len(resampled) == 60
    again = MultiEpochDatasetResampler(dataset(), num_epochs=3, seed=7)
    for i in (0, 19, 20, 59):
        for key in ("text_enc", "labels"):
            assert torch.equal(resampled[i][key], again[i][key])


def test_span_statistics() -> None:
    g = torch.Generator().manual_seed(1)
    lengths = []
    for _ in range(200):
        mask = random_spans_noise_mask(100, 0.15, 3.0, g)
        assert int(mask.sum()) == 15 and not bool(mask[0])
        starts = mask & ~torch.cat([torch.zeros(1, dtype=torch.bool), mask[:-1]])
        lengths.append(15 / int(starts.sum()))
    assert sum(lengths) / len(lengths) == pytest.approx(3.0, rel=0.05)


def test_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="sentinel_ids is empty"):
        dataset(sentinel_ids=[])
    with pytest.raises(ValueError, match="noise_density"):
        dataset(noise_density=1.0)
    with pytest.raises(ValueError, match="decoder_length=4"):
        ds = dataset(decoder_length=4)
        for i in range(20):
            ds[EpochIndex(0, i)]
    with pytest.raises(ValueError, match="sentinel_ids"):
        ds = dataset(sentinel_ids=[900], mean_noise_span_length=1.0)
        for i in range(20):
            ds[EpochIndex(0, i)]
