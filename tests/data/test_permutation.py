"""Tests of the O(1)-memory seeded permutation and the seed hash."""

import numpy as np
import pytest

from epochal.data import permute, permute_array
from epochal.data.epochs.permutation import (
    MAX_LENGTH,
    derive_seed,
    derive_seed_array,
    mix64,
    mix64_array,
    permute_grouped,
)

SEEDS = (0, 1, 42, 2**32 + 5, 2**64 - 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_small_length_is_a_permutation(seed):
    for length in range(1, 300):
        out = permute_array(np.arange(length), length, seed)
        assert out.dtype == np.int64
        assert np.array_equal(np.sort(out), np.arange(length)), (length, seed)


def test_scalar_matches_vectorized_exhaustively():
    for length in (1, 2, 3, 7, 8, 9, 100, 257, 1000):
        for seed in (0, 7, 2**63 + 11):
            scalar = [permute(i, length, seed) for i in range(length)]
            assert permute_array(np.arange(length), length, seed).tolist() == scalar


def test_larger_lengths_exhaustive():
    for length in (2**16, 2**16 + 1, 3 * 2**17 + 5):
        out = permute_array(np.arange(length, dtype=np.int64), length, 123)
        assert np.array_equal(np.sort(out), np.arange(length))


@pytest.mark.parametrize(
    "length",
    [2**31 + 1, 2**32, 2**32 + 1, 2**40 + 3, 10**15, 2**62 - 1, 2**62, 2**62 + 1, MAX_LENGTH],
)
def test_huge_lengths_by_sampling(length):
    rng = np.random.default_rng(length % 2**32)
    idx = np.unique(rng.integers(0, min(length, 2**63 - 1), size=50_000, dtype=np.int64))
    idx = np.concatenate([idx, [0, length - 1]]).astype(np.uint64)
    idx = np.unique(idx)
    out = permute_array(idx, length, 99)
    assert out.min() >= 0 and (out.astype(np.uint64) < np.uint64(length)).all()
    assert np.unique(out).size == idx.size  # injective on the sample
    for i in idx[:50].tolist() + [length - 1]:
        j = permute(int(i), length, 99)
        assert 0 <= j < length
    assert [permute(int(i), length, 99) for i in idx[:50]] == out[:50].tolist()


def test_array_seeds_match_scalar_seeds():
    length = 1000
    idx = np.tile(np.arange(length), 3)
    seeds = np.repeat(np.array([5, 6, 2**64 - 2], dtype=np.uint64), length)
    out = permute_array(idx, length, seeds)
    for k, s in enumerate([5, 6, 2**64 - 2]):
        assert np.array_equal(
            out[k * length : (k + 1) * length], permute_array(np.arange(length), length, s)
        )


def test_grouped_seeds_match_per_seed_calls():
    table = np.array([3, 2**64 - 1, 0], dtype=np.uint64)
    idx = np.arange(300) % 97
    group = np.arange(300) % 3
    out = permute_grouped(idx, 97, table, group)
    expected = [permute(int(i), 97, int(table[k])) for i, k in zip(idx, group)]
    assert out.tolist() == expected
    assert permute_grouped(idx, 97, table[:1]).tolist() == permute_array(idx, 97, 3).tolist()


def test_shape_preserved_and_empty():
    idx = np.arange(12).reshape(3, 4)
    out = permute_array(idx, 12, 3)
    assert out.shape == (3, 4)
    assert np.array_equal(out.ravel(), permute_array(idx.ravel(), 12, 3))
    assert permute_array(np.array([], dtype=np.int64), 5, 1).shape == (0,)


def test_different_seeds_give_different_orders():
    length = 1000
    orders = {tuple(permute_array(np.arange(length), length, s)) for s in range(20)}
    assert len(orders) == 20
    assert not np.array_equal(permute_array(np.arange(length), length, 0), np.arange(length))


def test_positions_are_uniform_over_seeds():
    # chi-square of where index 0 lands, over many seeds, for a small length
    for length in (5, 7, 12, 100):
        seeds = np.arange(20_000, dtype=np.uint64) * 3 + 1
        landed = permute_array(np.zeros(seeds.size, dtype=np.int64), length, seeds)
        counts = np.bincount(landed, minlength=length)
        expected = seeds.size / length
        chi2 = ((counts - expected) ** 2 / expected).sum()
        dof = length - 1
        assert chi2 < dof + 6 * np.sqrt(2 * dof), (length, chi2)


def test_golden_values_are_stable():
    # Orders must never change between versions: resumed runs depend on them.
    assert [permute(i, 10, 42) for i in range(10)] == [4, 8, 9, 6, 0, 2, 3, 5, 1, 7]
    assert permute(123456789, 10**12, 7) == 617088334237
    assert permute_array(np.array([123456789]), 10**12, 7)[0] == 617088334237


def test_errors():
    with pytest.raises(ValueError, match="length"):
        permute(0, 0, 1)
    with pytest.raises(ValueError, match="length"):
        permute(0, MAX_LENGTH + 1, 1)
    with pytest.raises(ValueError, match="index"):
        permute(5, 5, 1)
    with pytest.raises(ValueError, match="index"):
        permute(-1, 5, 1)
    with pytest.raises(ValueError, match="seed"):
        permute(0, 5, -1)
    with pytest.raises(ValueError, match="seed"):
        permute(0, 5, 2**64)
    with pytest.raises(TypeError, match="index"):
        permute(1.0, 5, 1)
    with pytest.raises(TypeError, match="seed"):
        permute(1, 5, 1.5)
    with pytest.raises(ValueError, match="indices"):
        permute_array(np.array([0, 5]), 5, 1)
    with pytest.raises(ValueError, match="indices"):
        permute_array(np.array([-1, 2]), 5, 1)
    with pytest.raises(TypeError, match="indices"):
        permute_array(np.array([0.0, 1.0]), 5, 1)
    with pytest.raises(TypeError, match="indices"):
        permute_array(np.array([True]), 5, 1)
    with pytest.raises(ValueError, match="seed"):
        permute_array(np.array([0, 1]), 5, np.array([1, -1]))
    with pytest.raises(ValueError, match="length"):
        permute_array(np.array([0]), 0, 1)


def test_length_one():
    assert permute(0, 1, 42) == 0
    assert permute_array(np.zeros(3, dtype=np.int64), 1, 42).tolist() == [0, 0, 0]


def test_derive_seed_and_mix():
    assert derive_seed(1, 2) != derive_seed(2, 1)
    assert derive_seed(1) != derive_seed(1, 0)
    assert len({derive_seed(42, e) for e in range(1000)}) == 1000
    words = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    got = derive_seed_array(7, words, 3)
    assert got.tolist() == [derive_seed(7, int(w), 3) for w in words]
    assert mix64_array(words).tolist() == [mix64(int(w)) for w in words]
    with pytest.raises(ValueError, match="word"):
        derive_seed(1, -1)
    with pytest.raises(ValueError, match="seed"):
        derive_seed(2**64)
