"""WrappedDataLoader: required mode, exact resume from its own state, padding, workers."""

from __future__ import annotations

import pickle

import pytest
import torch

from epochal.data import (
    PAD,
    DataExhaustedError,
    LoaderStateError,
    MegatronPretrainingBatchSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    PaddedDataset,
    WrappedDataLoader,
)
from epochal.data.loading.padding import PaddingError, zeros_like_sample
from tests.data.resumable_helpers import SEQ_LEN, NegativeIndexFriendlyList, ToyGPTDataset, ids_of


def _loader(
    n=40, consumed=0, mbs=2, rank=0, dp=1, mode="train", cls=MegatronPretrainingSampler, **kw
):
    sampler_kw = {
        k: kw.pop(k)
        for k in list(kw)
        if k
        in (
            "drop_last",
            "global_batch_size",
            "global_shuffle",
            "pad_samples_to_global_batch_size",
            "seed",
        )
    }
    sampler = cls(n, consumed, mbs, rank, dp, **sampler_kw)
    return WrappedDataLoader(ToyGPTDataset(n), mode=mode, batch_sampler=sampler, **kw)


def test_mode_is_required_and_checked():
    with pytest.raises(TypeError, match="needs mode="):
        WrappedDataLoader(ToyGPTDataset(4), batch_size=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        WrappedDataLoader(ToyGPTDataset(4), mode="val")
    loader = WrappedDataLoader(dataset=ToyGPTDataset(4), mode="validation", batch_size=2)
    assert loader.mode == "validation" and len(loader) == 2


def test_plain_loader_state_and_refused_position():
    loader = WrappedDataLoader(ToyGPTDataset(4), mode="train", batch_size=2)
    assert [ids_of(b) for b in loader] == [[0, 1], [2, 3]]
    assert loader.state_dict() == {"mode": "train"} and loader.megatron_sampler is None
    loader.load_state_dict({"mode": "train"})
    with pytest.raises(LoaderStateError, match="no Megatron batch sampler"):
        loader.load_state_dict({"consumed_samples": 2, "mode": "train"})


def test_train_loader_resumes_exactly_from_state_dict():
    reference = [ids_of(b) for b in _loader(mbs=2, rank=1, dp=2)]
    loader = _loader(mbs=2, rank=1, dp=2)
    it = iter(loader)
    first = [ids_of(next(it)) for _ in range(3)]
    state = loader.state_dict()
    assert state == {"consumed_samples": 12, "mode": "train"}
    assert len(loader) == 10
    resumed = _loader(mbs=2, rank=1, dp=2)
    resumed.load_state_dict(state)
    assert len(resumed) == 10  # does not shrink on resume
    assert first + [ids_of(b) for b in resumed] == reference
    # a state from a run with another data-parallel size continues the same global order
    one_rank = _loader(mbs=4, rank=0, dp=1)
    one_rank.load_state_dict(state)
    assert [ids_of(b) for b in one_rank][0] == [12, 13, 14, 15]


def test_validation_loader_never_resumes():
    val = _loader(n=12, mode="validation")
    first = [ids_of(b) for b in val]
    it = iter(val)
    next(it)
    assert val.state_dict() == {"consumed_samples": 0, "mode": "validation"}
    val.load_state_dict({"consumed_samples": 0, "mode": "validation"})
    assert [ids_of(b) for b in val] == first == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    with pytest.raises(LoaderStateError, match="mode 'train'"):
        val.load_state_dict({"consumed_samples": 4, "mode": "train"})


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ([1, 2], "must be a mapping"),
        ({"consumed_samples": 2, "epoch": 1}, "unknown keys"),
        ({"consumed_samples": -2}, "integer >= 0"),
        ({"consumed_samples": 2.0}, "integer >= 0"),
        ({"consumed_samples": 41}, "beyond the end"),
    ],
)
def test_invalid_states(state, needle):
    with pytest.raises(LoaderStateError, match=needle):
        _loader().load_state_dict(state)


def test_cyclic_loader_rejects_misaligned_position():
    loader = _loader(cls=MegatronPretrainingRandomSampler, dp=2)
    with pytest.raises(LoaderStateError, match="not a multiple"):
        loader.load_state_dict({"consumed_samples": 2})


def test_single_pass_exhaustion_is_loud_and_stream_ends():
    loader = _loader(n=8, mbs=4)
    assert [ids_of(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.consumed_samples == 8
    iter(
        loader
    )  # creating the iterator is fine (Lightning does it when resuming at the very end) ...
    with pytest.raises(DataExhaustedError, match="exhausted"):
        next(iter(loader))  # ... asking for data is not
    assert list(loader.stream()) == []
    fresh = _loader(n=8, mbs=4)
    assert [ids_of(b) for b in fresh.stream()] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_cyclic_stream_crosses_epochs_and_resumes():
    kw = {
        "cls": MegatronPretrainingRandomSampler,
        "n": 10,
        "mbs": 2,
        "global_batch_size": 4,
        "global_shuffle": True,
    }
    stream = _loader(**kw).stream()
    seq = [ids_of(next(stream)) for _ in range(9)]  # epochs of 8 samples = 4 micro-batches
    epoch0 = sorted(i for mb in seq[:4] for i in mb)
    epoch1 = sorted(i for mb in seq[4:8] for i in mb)
    assert len(set(epoch0)) == 8 and len(set(epoch1)) == 8 and seq[:4] != seq[4:8]
    loader = _loader(**kw)
    s = loader.stream()
    for _ in range(6):
        next(s)
    state = loader.state_dict()
    assert state["consumed_samples"] == 12
    again = _loader(**kw)
    again.load_state_dict(state)
    s2 = again.stream()
    assert [ids_of(next(s2)) for _ in range(3)] == seq[6:9]


def test_padding_gives_loss_masked_zero_samples():
    loader = _loader(
        n=11,
        mbs=2,
        rank=1,
        dp=2,
        drop_last=False,
        global_batch_size=8,
        pad_samples_to_global_batch_size=True,
    )
    assert isinstance(loader.dataset, PaddedDataset) and isinstance(
        loader.source_dataset, ToyGPTDataset
    )
    batches = list(loader)
    assert len(batches) == 4
    real = batches[0]
    for b in batches:  # same keys, shapes and dtypes as a real micro-batch
        assert b.keys() == real.keys()
        for k in b:
            assert b[k].shape == real[k].shape and b[k].dtype == real[k].dtype
    # rank 1: [10, PAD] then [PAD, PAD]
    assert batches[2]["loss_mask"].tolist() == [[1.0] * SEQ_LEN, [0.0] * SEQ_LEN]
    assert batches[2]["id"].tolist() == [10, 0]
    assert not batches[3]["loss_mask"].any() and not batches[3]["tokens"].any()
    assert loader.consumed_samples == 16  # the padded global batch counts whole, like a step
    assert list(loader.stream()) == []  # nothing left after the padding
    with pytest.raises(DataExhaustedError):
        next(iter(loader))


def test_padding_never_reaches_a_negative_index_friendly_dataset():
    data = NegativeIndexFriendlyList(
        {"id": torch.tensor(i), "loss_mask": torch.ones(2)} for i in range(5)
    )
    sampler = MegatronPretrainingSampler(
        5, 0, 2, 0, 1, drop_last=False, global_batch_size=4, pad_samples_to_global_batch_size=True
    )
    batches = list(WrappedDataLoader(data, mode="test", batch_sampler=sampler))
    ids = [i for b in batches for i, m in zip(b["id"].tolist(), b["loss_mask"][:, 0].tolist()) if m]
    assert ids == [0, 1, 2, 3, 4]  # each real sample once; the 3 padding samples are masked
    # the raw sentinel is not an int, so a dataset used without the loader fails loudly
    with pytest.raises(TypeError):
        ToyGPTDataset(5)[PAD]


def test_padded_dataset_view_pickles_and_delegates():
    view = PaddedDataset(PaddedDataset(ToyGPTDataset(3, seed=4)))  # never nested
    assert isinstance(view.dataset, ToyGPTDataset) and view.seed == 4 and len(view) == 3
    copy = pickle.loads(pickle.dumps(view))  # what a spawned DataLoader worker receives
    assert torch.equal(copy[1]["tokens"], view[1]["tokens"])
    padded = copy.__getitems__([PAD, PAD])
    assert len(padded) == 2 and not padded[0]["loss_mask"].any() and padded[0] is not padded[1]
    assert view[PAD]["tokens"].shape == view[0]["tokens"].shape


def test_padding_needs_a_loss_mask():
    data = [torch.tensor([i]) for i in range(3)]
    sampler = MegatronPretrainingSampler(
        3, 0, 2, 0, 1, drop_last=False, global_batch_size=2, pad_samples_to_global_batch_size=True
    )
    with pytest.raises(PaddingError, match="loss_mask"):
        list(WrappedDataLoader(data, mode="test", batch_sampler=sampler))
    with pytest.raises(PaddingError, match="unsupported type"):
        zeros_like_sample({"loss_mask": torch.ones(1), "obj": object()})
    assert zeros_like_sample({"loss_mask": [1.0, 2], "n": (3, "a", None)}) == {
        "loss_mask": [0.0, 0],
        "n": (0, "", None),
    }


def test_batch_sampler_loader_counts_global_batches():
    sampler = MegatronPretrainingBatchSampler(30, 0, 1, 8, 0, 1, rampup_batch_size=[4, 4, 8])
    loader = WrappedDataLoader(ToyGPTDataset(30), mode="train", batch_sampler=sampler)
    it = iter(loader)
    sizes = [len(ids_of(next(it))) for _ in range(3)]
    assert sizes == [4, 4, 8] and loader.consumed_samples == 16


def _epochs_of_ids(loader, passes):
    out = []
    for _ in range(passes):
        out.append([ids_of(b) for b in loader])
    return out


def test_workers_and_persistent_workers_give_identical_batches():
    kw = {
        "cls": MegatronPretrainingRandomSampler,
        "n": 24,
        "mbs": 2,
        "rank": 1,
        "dp": 2,
        "global_batch_size": 8,
        "global_shuffle": True,
        "seed": 7,
    }
    reference = _epochs_of_ids(_loader(**kw), 3)
    assert reference[0] != reference[1]
    for extra in (
        {"num_workers": 1},
        {"num_workers": 2},
        {"num_workers": 2, "persistent_workers": True},
    ):
        loader = _loader(**kw, **extra)
        assert _epochs_of_ids(loader, 2) == reference[:2], extra
        # stop after 2 micro-batches of the third epoch: workers have prefetched more indices,
        # but the position counts delivered micro-batches only
        it = iter(loader)
        assert [ids_of(next(it)) for _ in range(2)] == reference[2][:2]
        state = loader.state_dict()
        assert state["consumed_samples"] == 2 * 24 + 2 * 4, extra
        resumed = _loader(**kw, **extra)
        resumed.load_state_dict(state)
        assert [ids_of(b) for b in resumed] == reference[2][2:], extra
