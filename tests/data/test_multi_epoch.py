"""Tests of MultiEpochDatasetResampler and the multi-epoch wrappers."""

import tracemalloc

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from epochal.data import (
    EpochIndex,
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
    MultiEpochDatasetWrapper,
)


class KeyDataset:
    """Returns its key; records nothing, so it is trivially deterministic."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return EpochIndex(*index)


class AddEpoch(MultiEpochDatasetWrapper[int, int]):
    def apply_transform(self, sample, index):
        return sample * 1000 + index.epoch


def _epochs(resampler, n, num_epochs):
    keys = [resampler[g] for g in range(n * num_epochs)]
    return [keys[e * n : (e + 1) * n] for e in range(num_epochs)]


def test_every_epoch_is_a_permutation_and_epochs_differ():
    n = 50
    r = MultiEpochDatasetResampler(KeyDataset(n), num_epochs=4, seed=3)
    assert len(r) == 200
    orders = []
    for e, keys in enumerate(_epochs(r, n, 4)):
        assert all(k.epoch == e for k in keys)
        idx = [k.idx for k in keys]
        assert sorted(idx) == list(range(n))
        orders.append(tuple(idx))
    assert len(set(orders)) == 4
    assert orders[0] != tuple(range(n))


def test_seed_changes_order_and_is_reproducible():
    n = 64
    a = [MultiEpochDatasetResampler(KeyDataset(n), seed=1)[g].idx for g in range(n)]
    b = [MultiEpochDatasetResampler(KeyDataset(n), seed=1)[g].idx for g in range(n)]
    c = [MultiEpochDatasetResampler(KeyDataset(n), seed=2)[g].idx for g in range(n)]
    assert a == b
    assert a != c


def test_no_shuffle_is_sequential():
    r = MultiEpochDatasetResampler(KeyDataset(3), num_epochs=2, shuffle=False)
    assert [tuple(r[g]) for g in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_num_samples_cuts_the_last_epoch():
    n = 10
    r = MultiEpochDatasetResampler(KeyDataset(n), num_samples=25, seed=5)
    assert len(r) == 25 and r.num_epochs == 3
    full = MultiEpochDatasetResampler(KeyDataset(n), num_epochs=3, seed=5)
    assert [r[g] for g in range(25)] == [full[g] for g in range(25)]
    with pytest.raises(IndexError):
        r[25]


def test_default_is_one_epoch():
    r = MultiEpochDatasetResampler(KeyDataset(7))
    assert len(r) == 7 and r.num_epochs == 1 and r.num_samples == 7


def test_length_one_dataset_with_shuffle():
    r = MultiEpochDatasetResampler(
        IdentityMultiEpochDatasetWrapper(["only"]), num_epochs=5, shuffle=True
    )
    assert [r[g] for g in range(5)] == ["only"] * 5
    assert r.epoch_indices(0, 5)[1].tolist() == [0] * 5


def test_range_and_array_mapping_match_scalar():
    n = 37
    r = MultiEpochDatasetResampler(KeyDataset(n), num_samples=500, seed=11)
    for start, stop in [(0, 500), (30, 80), (74, 74), (499, 500), (36, 38)]:
        epochs, idx = r.epoch_indices(start, stop)
        assert epochs.dtype == np.int64 and idx.dtype == np.int64
        assert list(zip(epochs.tolist(), idx.tolist())) == [
            tuple(r.epoch_index(g)) for g in range(start, stop)
        ]
    g = np.array([[499, 0], [37, 123]])
    epochs, idx = r.map_indices(g)
    assert epochs.shape == (2, 2)
    assert [tuple(r.epoch_index(int(x))) for x in g.ravel()] == list(
        zip(epochs.ravel().tolist(), idx.ravel().tolist())
    )
    all_e, all_i = r.map_indices(np.arange(500)[::-1])  # dense epochs: gathered seed table
    assert np.array_equal(all_e[::-1], r.epoch_indices(0, 500)[0])
    assert np.array_equal(all_i[::-1], r.epoch_indices(0, 500)[1])
    unshuffled = MultiEpochDatasetResampler(KeyDataset(n), num_samples=100, shuffle=False)
    assert unshuffled.epoch_indices(30, 40)[1].tolist() == [g % n for g in range(30, 40)]
    assert unshuffled.map_indices(np.arange(30, 40))[1].tolist() == [g % n for g in range(30, 40)]


def test_huge_run_constant_memory():
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        r = MultiEpochDatasetResampler(KeyDataset(1000), num_samples=10**12, seed=9)
        last = r[10**12 - 1]
        epochs, idx = r.epoch_indices(10**12 - 2000, 10**12)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(r) == 10**12 and r.num_epochs == 10**9
    assert last == (10**9 - 1, int(idx[-1]))
    assert sorted(idx[-1000:].tolist()) == list(range(1000))
    assert peak < 512 * 1024, peak  # a few arrays of 2000 indices; nothing per epoch


def test_errors():
    ds = KeyDataset(10)
    with pytest.raises(ValueError, match="only one"):
        MultiEpochDatasetResampler(ds, num_epochs=1, num_samples=10)
    with pytest.raises(ValueError, match="num_epochs"):
        MultiEpochDatasetResampler(ds, num_epochs=0)
    with pytest.raises(ValueError, match="num_samples"):
        MultiEpochDatasetResampler(ds, num_samples=0)
    with pytest.raises(ValueError, match="empty"):
        MultiEpochDatasetResampler(KeyDataset(0))
    with pytest.raises(ValueError, match="seed"):
        MultiEpochDatasetResampler(ds, seed=-1)
    with pytest.raises(TypeError, match="num_epochs"):
        MultiEpochDatasetResampler(ds, num_epochs=1.5)
    r = MultiEpochDatasetResampler(ds, num_epochs=2)
    for bad in (-1, 20, 10**30):
        with pytest.raises(IndexError):
            r[bad]
    with pytest.raises(TypeError):
        r[1.0]
    with pytest.raises(IndexError):
        r.epoch_indices(5, 21)
    with pytest.raises(IndexError):
        r.epoch_indices(6, 5)
    with pytest.raises(IndexError):
        r.map_indices(np.array([0, -1]))
    with pytest.raises(IndexError):
        r.map_indices(np.array([20]))


def test_wrapper_transform_and_errors():
    w = AddEpoch([1, 2, 3])
    assert len(w) == 3
    assert w[EpochIndex(4, 1)] == 2004
    assert w[(0, 2)] == 3000
    with pytest.raises(TypeError, match="EpochIndex"):
        w[1]
    with pytest.raises(IndexError):
        w[EpochIndex(0, 3)]
    with pytest.raises(IndexError):
        w[EpochIndex(-1, 0)]
    with pytest.raises(TypeError):
        MultiEpochDatasetWrapper([1])  # abstract


def test_getitems_and_dataloader_worker_counts_agree():
    r = MultiEpochDatasetResampler(AddEpoch(list(range(13))), num_epochs=3, seed=4)
    assert r.__getitems__([0, 5, 38]) == [r[0], r[5], r[38]]
    expected = torch.tensor([r[g] for g in range(len(r))])
    for workers in (0, 2):
        loader = DataLoader(r, batch_size=4, num_workers=workers, shuffle=False)
        got = torch.cat(list(loader))
        assert torch.equal(got, expected), workers
