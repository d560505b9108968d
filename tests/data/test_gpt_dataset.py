"""Unit tests of GPTDataset: windows, masks, padding, arguments, EpochIndex use."""

import warnings

import numpy as np
import pytest
import torch

from epochal.data.datasets.gpt_dataset import GPTDataset, ltor_masks_and_position_ids
from epochal.data.epochs.epoch_index import EpochIndex
from epochal.data.epochs.multi_epoch import MultiEpochDatasetResampler
from epochal.data.indexed.indexed_dataset import IndexedDataset
from tests.data.gpt_corpus import EOD, ArrayCorpus, random_documents, write_ours


@pytest.fixture(scope="module")
def docs():
    return random_documents(11, 40, max_length=30)


@pytest.fixture(scope="module")
def indexed(docs, tmp_path_factory):
    return IndexedDataset(write_ours(str(tmp_path_factory.mktemp("gptds")), "corpus", docs))


def stream(docs, document_index):
    return np.concatenate([docs[d] for d in document_index])


@pytest.mark.parametrize("extra", [True, False])
def test_samples_are_consecutive_windows_of_the_shuffled_stream(docs, indexed, extra):
    ds = GPTDataset(indexed, np.arange(5, 35), 200, 10, seed=3, add_extra_token_to_sequence=extra)
    assert len(ds) >= 200 and ds.num_epochs > 1
    tokens = stream(docs, ds.document_index)
    for i in range(len(ds)):
        k = int(ds.shuffle_index[i])
        window = tokens[k * 10 : k * 10 + 10 + extra]
        sample = ds[i]
        assert sample["tokens"].dtype == torch.int64 and sample["tokens"].shape == (10,)
        assert sample["labels"].dtype == torch.int64 and sample["loss_mask"].dtype == torch.float32
        assert sample["position_ids"].dtype == torch.int64
        assert "attention_mask" not in sample
        np.testing.assert_array_equal(sample["tokens"].numpy(), window[:10])
        if extra:
            np.testing.assert_array_equal(sample["labels"].numpy(), window[1:])
            assert torch.all(sample["loss_mask"] == 1)
        else:
            np.testing.assert_array_equal(sample["labels"][:-1].numpy(), window[1:])
            assert sample["labels"][-1] == 0 and sample["loss_mask"][-1] == 0
    # only documents 5..34 are used, each once per epoch
    counts = np.bincount(ds.document_index, minlength=40)
    assert (
        counts[:5].sum() == 0 and counts[35:].sum() == 0 and np.all(counts[5:35] == ds.num_epochs)
    )


def test_partial_last_window_is_padded_and_masked(docs, indexed):
    ds = GPTDataset(indexed, None, None, 16, seed=1, drop_last_partial_sequence=False)
    last = int(np.flatnonzero(np.asarray(ds.shuffle_index) == len(ds) - 1)[0])
    sample = ds[last]
    total = int(indexed.sequence_lengths.sum())
    real = total - (len(ds) - 1) * 16 - 1  # labels that come from real tokens
    assert 0 < real < 16
    assert torch.all(sample["loss_mask"][:real] == 1) and torch.all(sample["loss_mask"][real:] == 0)
    assert torch.all(sample["labels"][real:] == 0)
    full = GPTDataset(indexed, None, None, 16, seed=1)
    assert len(full) == len(ds) - 1


def test_none_index_is_a_padding_sample(indexed):
    ds = GPTDataset(indexed, None, 10, 8, seed=0)
    pad = ds[None]
    assert torch.equal(pad["tokens"], ds.__getitem__(0)["tokens"]) or pad["tokens"].shape == (8,)
    assert torch.all(pad["loss_mask"] == 0)


def test_masks_and_positions_reset_at_eod():
    tokens = torch.tensor([5, 6, EOD, 7, 8, 9, EOD, 4])
    mask, loss, pos = ltor_masks_and_position_ids(tokens, EOD, True, True, True, True)
    assert pos.tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert loss.tolist() == [1, 1, 0, 1, 1, 1, 0, 1]
    allowed = ~mask[0]
    assert allowed[4].tolist() == [False, False, False, True, True, False, False, False]
    assert allowed[2].tolist() == [True, True, True, False, False, False, False, False]
    mask, loss, pos = ltor_masks_and_position_ids(tokens, EOD, False, False, False, True)
    assert pos.tolist() == list(range(8)) and torch.all(loss == 1)
    assert torch.equal(~mask[0], torch.ones(8, 8, dtype=torch.bool).tril())
    assert ltor_masks_and_position_ids(tokens, EOD, False, True, False, False)[0] is None


def test_dataset_applies_eod_options(indexed):
    ds = GPTDataset(
        indexed,
        None,
        20,
        24,
        seed=2,
        reset_position_ids=True,
        reset_attention_mask=True,
        eod_mask_loss=True,
        create_attention_mask=True,
        eod_token_id=EOD,
    )
    for i in range(len(ds)):
        s = ds[i]
        assert s["attention_mask"].shape == (1, 24, 24) and s["attention_mask"].dtype == torch.bool
        eod = s["tokens"] == EOD
        assert torch.all(s["loss_mask"][eod] == 0)
        after = torch.nonzero(eod).flatten() + 1
        after = after[after < 24]
        assert torch.all(s["position_ids"][after] == 0)


def test_epoch_index_and_multi_epoch_resampler(indexed):
    ds = GPTDataset(indexed, None, None, 12, seed=4)
    for i in (0, 3, len(ds) - 1):
        for epoch in (0, 5):
            assert torch.equal(ds[EpochIndex(epoch, i)]["tokens"], ds[i]["tokens"])
    resampler = MultiEpochDatasetResampler(ds, num_epochs=3, shuffle=True, seed=9)
    assert len(resampler) == 3 * len(ds)
    n = len(ds)
    for epoch in range(3):
        seen = sorted(
            tuple(resampler[g]["tokens"].tolist()) for g in range(epoch * n, (epoch + 1) * n)
        )
        assert seen == sorted(tuple(ds[i]["tokens"].tolist()) for i in range(n))
    first = [resampler[g]["tokens"][0].item() for g in range(n)]
    second = [resampler[g]["tokens"][0].item() for g in range(n, 2 * n)]
    assert first != second  # a fresh order each epoch


def test_duck_typed_corpus_and_negative_index(docs):
    ds = GPTDataset(ArrayCorpus(docs), None, 30, 8, seed=5)
    assert torch.equal(ds[-1]["tokens"], ds[len(ds) - 1]["tokens"])
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
    with pytest.raises(TypeError, match="int"):
        ds["3"]


def test_pad_collision_with_eod_uses_the_sentinel(indexed):
    with pytest.warns(UserWarning, match="pad_token_id"):
        ds = GPTDataset(indexed, None, 5, 8, seed=0, pad_token_id=EOD, eod_token_id=EOD)
    assert ds.pad_token_id == -1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPTDataset(indexed, None, 5, 8, seed=0, pad_token_id=77).pad_token_id == 77


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"seq_length": 0}, ValueError, "seq_length"),
        ({"seq_length": 2.5}, TypeError, "seq_length"),
        ({"seed": -1}, ValueError, "seed"),
        ({"num_samples": -3}, ValueError, "num_samples"),
        ({"split": "training"}, ValueError, "split"),
        ({"reset_position_ids": True}, ValueError, "eod_token_id"),
        ({"eod_mask_loss": True}, ValueError, "eod_token_id"),
        ({"document_ids": np.array([0, 99])}, IndexError, r"\[0, 40\)"),
        ({"document_ids": np.array([[0, 1]])}, ValueError, "1-D"),
        (
            {"document_ids": np.array([], dtype=np.int64), "split": "test"},
            ValueError,
            "test split .* empty.*40 documents",
        ),
        ({"seq_length": 10_000, "num_samples": None}, ValueError, "fewer than one sample"),
    ],
)
def test_invalid_arguments(indexed, kwargs, error, match):
    args = {"document_ids": None, "num_samples": 10, "seq_length": 8, "seed": 1, **kwargs}
    with pytest.raises(error, match=match):
        GPTDataset(indexed, **args)


def test_documents_without_tokens_raise_naming_the_split():
    corpus = ArrayCorpus(
        [np.array([1, 2, 3]), np.array([], dtype=np.int64), np.array([], dtype=np.int64)]
    )
    with pytest.raises(ValueError, match="valid split .* no tokens"):
        GPTDataset(corpus, np.array([1, 2]), 4, 2, seed=0, split="valid")


def test_not_an_indexed_dataset():
    with pytest.raises(TypeError, match="IndexedDataset interface"):
        GPTDataset([1, 2, 3], None, 1, 2, seed=0)
