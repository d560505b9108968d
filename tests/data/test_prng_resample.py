"""Tests of sampling with replacement in O(1) per index."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from epochal.data import PRNGResampleDataset
from epochal.data.epochs.prng_resample import resample_index, resample_indices


class Huge:
    """A dataset that only reports a length (items are their own index)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_defaults_and_determinism():
    ds = PRNGResampleDataset(list(range(100)))
    assert len(ds) == 100
    forward = [ds[i] for i in range(100)]
    backward = [ds[i] for i in reversed(range(100))][::-1]
    assert forward == backward
    assert forward == [PRNGResampleDataset(list(range(100)))[i] for i in range(100)]
    assert forward != [PRNGResampleDataset(list(range(100)), seed=43)[i] for i in range(100)]
    assert len(set(forward)) < 100  # with replacement: repeats are expected (p ~ 1 - 1e-42)


def test_random_access_any_order_is_o1():
    ds = PRNGResampleDataset(Huge(10**6), seed=1, num_samples=10**15)
    a = ds[10**15 - 1]
    b = ds[3]
    assert ds[10**15 - 1] == a and ds[3] == b
    assert 0 <= a < 10**6


def test_vectorized_matches_scalar_including_rejections():
    for n in (1, 2, 7, 1000, 2**40 + 1, 2**62 + 1, 2**63 - 1):
        idx = np.arange(3000)
        got = resample_indices(idx, n, 5)
        assert got.tolist() == [resample_index(i, n, 5) for i in range(3000)], n
        assert got.min() >= 0 and got.max() < n
    # for n = 2**62 + 1 about a quarter of the first draws are rejected: the path is exercised
    ds = PRNGResampleDataset(Huge(2**62 + 1), seed=9, num_samples=10**6)
    some = np.array([0, 17, 999_999])
    assert ds.sample_indices(some).tolist() == [ds.sample_index(int(i)) for i in some]


def test_uniform_without_modulo_bias():
    n = 7
    draws = resample_indices(np.arange(140_000), n, 3)
    counts = np.bincount(draws, minlength=n)
    expected = draws.size / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < (n - 1) + 6 * np.sqrt(2 * (n - 1)), counts
    # plain `hash % n` would put only 1/4 of the draws in the top third of this range
    n = 3 * 2**61
    top = resample_indices(np.arange(40_000), n, 4) >= 2 * 2**61
    assert abs(top.mean() - 1 / 3) < 0.02


def test_dataloader_worker_counts_agree():
    ds = PRNGResampleDataset(list(range(50)), seed=2, num_samples=64)
    expected = torch.tensor([ds[i] for i in range(64)])
    for workers in (0, 2):
        got = torch.cat(list(DataLoader(ds, batch_size=8, num_workers=workers)))
        assert torch.equal(got, expected)


def test_errors():
    with pytest.raises(ValueError, match="empty"):
        PRNGResampleDataset([])
    with pytest.raises(ValueError, match="num_samples"):
        PRNGResampleDataset([1], num_samples=-1)
    with pytest.raises(ValueError, match="seed"):
        PRNGResampleDataset([1], seed=-5)
    ds = PRNGResampleDataset([1, 2, 3], num_samples=4)
    for bad in (-1, 4):
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(TypeError):
        ds[0.5]
    with pytest.raises(IndexError):
        ds.sample_indices(np.array([0, 4]))
    with pytest.raises(TypeError):
        ds.sample_indices(np.array([0.0]))
    with pytest.raises(ValueError, match="length"):
        resample_index(0, 0, 1)
    with pytest.raises(TypeError, match="length"):
        resample_index(0, 5.0, 1)
    with pytest.raises(ValueError, match="index"):
        resample_index(-1, 5, 1)
    with pytest.raises(ValueError, match="indices"):
        resample_indices(np.array([3, -1]), 5, 1)
    with pytest.raises(TypeError, match="indices"):
        resample_indices(np.array([0.5]), 5, 1)
    assert len(PRNGResampleDataset([1], num_samples=0)) == 0
