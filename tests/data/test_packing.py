"""pack_padded_batch: the same samples, in the same order, without their padding."""

from __future__ import annotations

import pytest
import torch

from epochal.data.loading.packing import PACKED_KEY, pack_padded_batch, sample_lengths


def batch(lengths=(5, 2, 0, 4), s=6):
    b = len(lengths)
    padding = (torch.arange(s)[None] < torch.tensor(lengths)[:, None]).long()
    text = (torch.arange(b * s).view(b, s) + 1) * padding
    return {
        "text": text,
        "labels": torch.where(padding.bool(), 100 + text, -1),
        "loss_mask": padding.clone(),
        "padding_mask": padding,
        "embeddings": torch.randn(b, s, 3),
        "is_random": torch.tensor([1, 0, 1, 1]),
        "name": "kept as is",
    }


def test_packs_real_tokens_in_order_and_drops_empty_samples():
    data = batch()
    out = pack_padded_batch(data)
    assert out[PACKED_KEY].dtype == torch.int32
    assert out[PACKED_KEY].tolist() == [0, 5, 7, 11]  # the empty third sample is left out
    expected = [1, 2, 3, 4, 5, 7, 8, 19, 20, 21, 22]
    assert out["text"].tolist() == [expected]
    assert out["labels"].tolist() == [[100 + t for t in expected]]
    assert out["loss_mask"].tolist() == [[1] * 11] and out["padding_mask"].tolist() == [[1] * 11]
    real = data["padding_mask"].bool()
    assert torch.equal(out["embeddings"], data["embeddings"][real].unsqueeze(0))
    assert out["is_random"].tolist() == [1, 0, 1] and out["name"] == "kept as is"
    assert set(out) == set(data) | {PACKED_KEY}


def test_pad_to_multiple_adds_a_loss_masked_tail_sequence():
    out = pack_padded_batch(batch(), pad_to_multiple_of=8)
    assert out[PACKED_KEY].tolist() == [0, 5, 7, 11, 16]
    assert out["text"].shape == (1, 16) and out["embeddings"].shape == (1, 16, 3)
    assert out["text"][0, 11:].tolist() == [0] * 5
    assert out["loss_mask"][0].tolist() == [1] * 11 + [0] * 5
    assert out["padding_mask"][0].tolist() == [1] * 11 + [0] * 5
    assert out["is_random"].tolist() == [1, 0, 1, -1]
    # already a multiple: no tail
    assert pack_padded_batch(batch(), pad_to_multiple_of=11)[PACKED_KEY].tolist() == [0, 5, 7, 11]
    # nothing real at all: one tail keeps the row non-empty
    empty = pack_padded_batch(batch(lengths=(0, 0, 0, 0)), pad_to_multiple_of=2)
    assert empty[PACKED_KEY].tolist() == [0, 2] and empty["loss_mask"].sum() == 0


def test_without_padding_mask_every_token_is_real():
    out = pack_padded_batch({"tokens": torch.arange(6).view(2, 3), "loss_mask": torch.ones(2, 3)})
    assert out["tokens"].tolist() == [[0, 1, 2, 3, 4, 5]] and out[PACKED_KEY].tolist() == [0, 3, 6]


def test_bad_batches_are_refused_by_name():
    data = batch()
    data["padding_mask"] = data["padding_mask"].clone()
    data["padding_mask"][1, 4] = 1
    with pytest.raises(ValueError, match="padding_mask row 1 has a real token after padding"):
        pack_padded_batch(data)
    with pytest.raises(ValueError, match=r"batch\['weird'\] has shape \(3,\)"):
        pack_padded_batch({**batch(), "weird": torch.zeros(3)})
    with pytest.raises(ValueError, match="token tensor"):
        pack_padded_batch({"labels": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="already packed"):
        pack_padded_batch(pack_padded_batch(batch()))
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        pack_padded_batch(batch(), pad_to_multiple_of=0)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        sample_lengths(torch.ones(3))
