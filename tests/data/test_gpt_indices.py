"""Unit tests of the numpy GPT index builders against a port of Megatron's loop."""

import numpy as np
import pytest

from epochal.data.datasets import gpt_sample_index
from epochal.data.datasets.gpt_indices import (
    build_document_index,
    build_gpt_indices,
    build_sample_index,
    build_shuffle_index,
    count_samples,
    plan_epochs,
)
from tests.data.gpt_corpus import reference_sample_index


@pytest.mark.parametrize("seed", range(6))
def test_sample_index_matches_reference_loop(seed, monkeypatch):
    """Blocks of 1..7 documents (and the default) against a port of Megatron's loop."""
    rng = np.random.default_rng(seed)
    checked = 0
    paths = set()
    block = [1, 2, 7, 1 << 16][seed % 4]
    monkeypatch.setattr(gpt_sample_index, "BLOCK", block)
    for _ in range(150):
        ndocs = int(rng.integers(1, 30))
        # short documents (many per window) or long ones (several windows per document)
        max_length = int(rng.integers(2, 8)) if rng.integers(0, 2) else int(rng.integers(2, 60))
        sizes = rng.integers(0 if seed % 2 else 1, max_length, size=ndocs).astype(np.int32)
        if seed >= 4:  # an unused document too long for int32 block sums: the int64 blocks
            sizes = np.append(sizes, np.int32(2**30))
        if sizes[:ndocs].sum() < 3:
            continue
        epochs = int(rng.integers(1, 4))
        seq = int(rng.integers(1, 40))
        extra = bool(rng.integers(0, 2))
        drop = bool(rng.integers(0, 2))
        total = int(sizes[:ndocs].sum())
        doc_index = build_document_index(
            np.arange(ndocs), epochs, np.random.RandomState(seed), False
        )
        if drop and epochs * total - extra < seq:
            continue
        if not drop and sizes[doc_index[-1]] < extra:
            continue  # Megatron's loop writes a negative offset there (and asserts)
        ours = build_sample_index(sizes, doc_index, seq, epochs, total, drop, extra)
        paths.add(len(ours) - 1 < len(doc_index))  # fewer windows than documents, or more
        ref = reference_sample_index(sizes, doc_index, seq, epochs, total, drop, extra)
        assert ours.dtype == np.int32 and ours.shape == ref.shape
        np.testing.assert_array_equal(ours, ref)
        checked += 1
    assert checked > 50 and paths == {True, False}


def test_sample_windows_tile_the_token_stream():
    sizes = np.array([5, 1, 7, 3, 9, 2], dtype=np.int32)
    doc_index = np.array([3, 0, 5, 1, 4, 2], dtype=np.int32)
    idx = build_sample_index(sizes, doc_index, 4, 1, int(sizes.sum()), True, True)
    starts = np.concatenate([[0], np.cumsum(sizes[doc_index])])
    positions = starts[idx[:, 0]] + idx[:, 1]
    np.testing.assert_array_equal(positions, np.arange(len(idx)) * 4)


def test_count_samples_uses_float32_ceil():
    # 2**24 + 1 tokens is not representable in float32: ceil(float32(16777217) / 1) = 16777216
    assert count_samples(2**24 + 2, 1, False, True) == 2**24
    assert count_samples(2**24 + 2, 1, True, True) == 2**24 + 1
    assert count_samples(101, 10, False, True) == 10
    assert count_samples(102, 10, False, True) == 11
    assert count_samples(102, 10, True, True) == 10


def test_plan_epochs_last_epoch_threshold():
    # 1000 tokens/epoch, seq 10 -> 99 samples per epoch (with the extra token)
    plan = plan_epochs(1000, 99 + 70, 10)  # 70 of 99 from the last epoch: < int(0.8 * 99) = 79
    assert (plan.num_epochs, plan.separate_final_epoch, plan.num_samples_sans_final_epoch) == (
        2,
        True,
        99,
    )
    plan = plan_epochs(1000, 99 + 79, 10)
    assert (plan.num_epochs, plan.separate_final_epoch) == (2, False)
    assert plan_epochs(1000, 99, 10).num_epochs == 1
    assert plan_epochs(1000, None, 10).num_epochs == 1
    assert plan_epochs(1000, 100, 10, add_extra_token_to_sequence=False).num_epochs == 1
    assert plan_epochs(1000, 100, 10).num_epochs == 2


def test_document_index_epochs_and_separate_final_epoch():
    docs = np.arange(10, 20)
    idx = build_document_index(docs, 3, np.random.RandomState(0), True)
    assert idx.dtype == np.int32 and idx.shape == (30,)
    # the final epoch is shuffled on its own: it holds every document exactly once
    assert sorted(idx[20:].tolist()) == list(range(10, 20))
    assert sorted(idx[:20].tolist()) == sorted(list(range(10, 20)) * 2)


def test_shuffle_index_ranges_stay_apart():
    sh = build_shuffle_index(7, 12, np.random.RandomState(3))
    assert sh.dtype == np.uint32
    assert sorted(sh[:7].tolist()) == list(range(7)) and sorted(sh[7:].tolist()) == list(
        range(7, 12)
    )


def test_build_gpt_indices_is_a_pure_function_of_its_arguments():
    sizes = np.random.default_rng(0).integers(1, 30, size=50).astype(np.int32)
    a = build_gpt_indices(sizes, np.arange(5, 45), 120, 16, seed=9)
    b = build_gpt_indices(sizes, np.arange(5, 45), 120, 16, seed=9)
    c = build_gpt_indices(sizes, np.arange(5, 45), 120, 16, seed=10)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[2], c[2])
    assert a[1].shape[0] - 1 >= 120


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_tokens_per_epoch": 0, "num_samples": 3, "seq_length": 4}, "no tokens"),
        ({"num_tokens_per_epoch": 10, "num_samples": 3, "seq_length": 0}, "seq_length"),
        ({"num_tokens_per_epoch": 10, "num_samples": -1, "seq_length": 4}, "num_samples"),
    ],
)
def test_plan_epochs_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_epochs(**kwargs)


@pytest.mark.parametrize("num_samples", [None, 40, 130, 400])
def test_packed_shuffle_equals_the_plain_document_index(num_samples):
    """build_gpt_indices shuffles (length, id) pairs; the result equals the plain recipe."""
    sizes = np.random.default_rng(1).integers(0, 30, size=60).astype(np.int32)
    documents = np.arange(3, 57)
    doc, sample, shuffle = build_gpt_indices(sizes, documents, num_samples, 9, seed=21)
    plan = plan_epochs(int(sizes[documents].sum()), num_samples, 9)
    rs = np.random.RandomState(21)
    plain_doc = build_document_index(documents, plan.num_epochs, rs, plan.separate_final_epoch)
    plain_sample = build_sample_index(
        sizes, plain_doc, 9, plan.num_epochs, plan.num_tokens_per_epoch
    )
    total = plain_sample.shape[0] - 1
    first = plan.num_samples_sans_final_epoch if plan.separate_final_epoch else total
    plain_shuffle = build_shuffle_index(first, total, rs)
    for ours, plain in ((doc, plain_doc), (sample, plain_sample), (shuffle, plain_shuffle)):
        assert ours.dtype == plain.dtype
        np.testing.assert_array_equal(ours, plain)
