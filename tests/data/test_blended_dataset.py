"""Unit tests of BlendedDataset and the greedy blending indices."""

import numpy as np
import pytest

from epochal.data.datasets import blended_dataset as blended
from epochal.data.datasets.blended_dataset import (
    BlendedDataset,
    _greedy_loop,
    _greedy_scan,
    build_blending_indices,
    build_exhaustive_blending_indices,
    normalize_weights,
)
from epochal.data.epochs.epoch_index import EpochIndex


class Numbers:
    """A dataset whose sample j of dataset `tag` is {"value": (tag, j)}."""

    def __init__(self, tag, size):
        self.tag, self.size, self.name = tag, size, f"numbers-{tag}"

    def __len__(self):
        return self.size

    def __getitem__(self, j):
        assert 0 <= j < self.size
        return {"value": (self.tag, j)}


@pytest.mark.parametrize("weights", [[0.3, 0.7], [1, 1, 1], [5, 1, 2, 0.5]])
def test_greedy_blend_tracks_the_weights(weights):
    w = normalize_weights(weights)
    ds, sample = build_blending_indices(w, 2000)
    assert ds.dtype == np.int16 and sample.dtype == np.int64
    counts = np.zeros(len(w), dtype=np.int64)
    for t in range(2000):
        i = ds[t]
        assert sample[t] == counts[i]  # each dataset's samples are used in order
        counts[i] += 1
        assert np.all(np.abs(counts - np.asarray(w) * (t + 1)) < 1.0 + 1e-9)


def test_greedy_blend_ties_go_to_the_lower_index():
    ds, _ = build_blending_indices([0.5, 0.5], 6)
    assert ds.tolist() == [0, 1, 0, 1, 0, 1]
    ds, _ = build_blending_indices([0.25, 0.75], 4)
    assert ds.tolist() == [1, 0, 1, 1]


def test_exhaustive_blend_uses_every_sample_once():
    sizes = [7, 3, 11]
    ds, sample = build_exhaustive_blending_indices(sizes)
    assert len(ds) == 21 and np.bincount(ds).tolist() == sizes
    for i, n in enumerate(sizes):
        assert sample[ds == i].tolist() == list(range(n))


def test_blended_dataset_samples_and_epoch_index(tmp_path):
    datasets = [Numbers(0, 40), Numbers(1, 80)]
    blend = BlendedDataset(datasets, [1, 2], 100, split="valid", cache_dir=tmp_path)
    assert len(blend) == 100 and blend.weights == pytest.approx([1 / 3, 2 / 3])
    for t in range(100):
        item = blend[t]
        assert item["value"] == (item["dataset_id"], int(blend.dataset_sample_index[t]))
    assert blend[EpochIndex(3, 5)] == blend[5] and blend[-1] == blend[99]
    again = BlendedDataset(datasets, [1, 2], 100, split="valid", cache_dir=tmp_path)
    assert again.cache_info["cache_hit"] and not blend.cache_info["cache_hit"]
    np.testing.assert_array_equal(again.dataset_index, blend.dataset_index)
    with pytest.raises(IndexError):
        blend[100]


def test_blended_dataset_without_size_is_exhaustive():
    blend = BlendedDataset([Numbers(0, 5), Numbers(1, 9)], [5, 9], None)
    assert len(blend) == 14
    assert sorted(blend[t]["value"] for t in range(14)) == sorted(
        [(0, j) for j in range(5)] + [(1, j) for j in range(9)]
    )


def test_oversampling_names_the_dataset():
    with pytest.raises(
        ValueError, match=r"needs 70 samples from dataset 1 \(numbers-1\) but it has only 60"
    ):
        BlendedDataset([Numbers(0, 100), Numbers(1, 60)], [0.3, 0.7], 100)


@pytest.mark.parametrize(
    "datasets, weights, size, match",
    [
        ([], [], 10, "at least one"),
        ([Numbers(0, 5)], [1, 2], 10, "2 weights"),
        ([Numbers(0, 5), Numbers(1, 5)], [1, 0], 4, "weight 1"),
        ([Numbers(0, 5), Numbers(1, 5)], [1, -2], 4, "weight 1"),
        ([Numbers(0, 5), Numbers(1, 5)], [1, float("nan")], 4, "weight 1"),
        ([Numbers(0, 5), Numbers(1, 5)], [1, "2"], 4, "weight 1"),
        ([Numbers(0, 5), Numbers(1, 5)], [1, 2], -1, "size"),
        ([Numbers(0, 5), Numbers(1, 5)], [1.5, 2], None, "whole sample counts"),
    ],
)
def test_invalid_blend_arguments(datasets, weights, size, match):
    with pytest.raises(ValueError, match=match):
        BlendedDataset(datasets, weights, size)


def test_normalize_weights_rejects_bad_input():
    assert normalize_weights([1, 3]) == [0.25, 0.75]
    for bad in ([], [0, 0], [1, -1], [float("inf")]):
        with pytest.raises(ValueError):
            normalize_weights(bad)


@pytest.mark.parametrize(
    "weights",
    [
        [0.5, 0.5],
        [0.3, 0.7],
        [1 / 3, 2 / 3],
        [0.999, 0.001],
        [1e-9, 1.0],
        [0.6180339887, 1],
        [1, 1, 1],
        [0.3, 0.5, 0.2],
        [1e-6, 0.5, 0.5],
        [0, 2, 3],
        [5, 1, 2, 0.5, 3],
        list(range(1, 12)),  # past the compare chain: row-wise max, then equality masks
        list(range(1, 21)),  # numpy's argmax
        [1e-12 if i % 3 == 0 else i for i in range(1, 31)],  # argmax over a row per chunk
    ],
)
def test_vectorized_scan_equals_the_step_by_step_rule(weights):
    w = normalize_weights(weights)
    size = 70_000  # 17 chunks, a partial last chunk
    slow = _greedy_loop(w, size)
    fast = _greedy_scan(np.asarray(w), size)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])
    assert build_blending_indices(w, 0)[0].shape == (0,)


@pytest.mark.parametrize("weights", [[1.0], [0.5, 0.5], [0.2, 0.3, 0.5]])
@pytest.mark.parametrize("size", [1, 3, 5000])
def test_scan_of_one_chunk_starts_from_nothing(weights, size):
    fast = _greedy_scan(np.asarray(weights), size)
    slow = _greedy_loop(weights, size)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])


@pytest.mark.parametrize("rounds", [0, 2])
def test_scan_repairs_chunks_that_start_wrong(monkeypatch, rounds):
    """Without a warm-up most chunk guesses are wrong; the check catches and redoes them."""
    calls, runs = [], []
    monkeypatch.setattr(blended, "_REPAIR_ROUNDS", rounds)
    monkeypatch.setattr(blended, "_greedy_loop", lambda *a: calls.append(a) or _greedy_loop(*a))
    advance = blended._advance
    monkeypatch.setattr(blended, "_advance", lambda *a: runs.append(a) or advance(*a))
    w = np.asarray(normalize_weights([1e-3, 0.3, 0.2, 0.5]))
    fast = _greedy_scan(w, 100_000, warmup=0)
    slow = _greedy_loop(w.tolist(), 100_000)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])
    if rounds:  # wrong chunks redone together from their predecessors' ends
        assert len(runs) > 1 and not calls
    else:  # one by one
        assert len(runs) == 1 and calls


def test_scan_with_a_row_per_chunk_repairs_wrong_starts(monkeypatch):
    """Many datasets: wrong chunk starts (no warm-up) are caught and redone, exactly."""
    assert 26 >= blended._ROWS_FROM
    w = np.asarray(normalize_weights([1e-12, 1e-3] + list(range(1, 25))))
    for rounds in (0, 2):
        monkeypatch.setattr(blended, "_REPAIR_ROUNDS", rounds)
        fast = _greedy_scan(w, 60_000, warmup=0)
        slow = _greedy_loop(w.tolist(), 60_000)
        np.testing.assert_array_equal(fast[0], slow[0])
        np.testing.assert_array_equal(fast[1], slow[1])


def test_exhaustive_blend_finishes_with_the_exhaustive_rule(monkeypatch):
    monkeypatch.setattr(blended, "_SCAN_FROM", 0)  # the scan, then the exhaustive tail
    sizes = [30_001, 5, 17_777, 2]
    ds, sample = build_exhaustive_blending_indices(sizes)
    total = sum(sizes)
    slow = _greedy_loop([c / total for c in sizes], total, caps=sizes)
    np.testing.assert_array_equal(ds, slow[0])
    np.testing.assert_array_equal(sample, slow[1])


@pytest.mark.parametrize(
    "weights",
    [[0.5, 0.5], [0.3, 0.7], [0.7, 0.3], [1 / 3, 2 / 3], [0.999, 0.001], [1e-9, 1], [1, 0], [0, 1]],
)
def test_two_datasets_in_closed_form_equal_the_step_by_step_rule(monkeypatch, weights):
    from epochal.data.datasets import blend_two

    monkeypatch.setattr(blend_two, "_BLOCK", 777)  # many blocks, a partial last one
    w = normalize_weights(weights)
    assert blend_two.applies(np.asarray(w), 20_000)
    for size in (0, 1, 2, 3, 777, 778, 20_000):
        fast = build_blending_indices(w, size)
        slow = _greedy_loop(w, size)
        assert fast[0].dtype == np.int16 and fast[1].dtype == np.int64
        np.testing.assert_array_equal(fast[0], slow[0])
        np.testing.assert_array_equal(fast[1], slow[1])


def test_two_dataset_closed_form_needs_weights_summing_to_one():
    from epochal.data.datasets import blend_two

    assert not blend_two.applies(np.array([2.0, 1.0]), 10)  # Megatron's rule on raw weights
    assert not blend_two.applies(np.array([0.2, 0.3, 0.5]), 10)
    fast = build_blending_indices([2.0, 1.0], 5000)  # the general path, still Megatron's rule
    slow = _greedy_loop([2.0, 1.0], 5000)
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])


def test_two_dataset_recurrence_repairs_a_broken_chain():
    """Where u[t] - c[t] is not 0 or 1 the counts follow c[t + 1] = c[t] + (c[t] < u[t])."""
    from epochal.data.datasets import blend_two

    u = [1.0, 1.0, 3.0, 3.0, 2.0, 4.0, 5.0, 5.0]
    c = np.array([0.0, *u])  # c[0] exact, c[1:] = u
    blend_two._follow_recurrence(c, 1)
    expected = [0.0, 1.0]
    for threshold in u[1:]:
        expected.append(expected[-1] + (expected[-1] < threshold))
    np.testing.assert_array_equal(c, expected)
