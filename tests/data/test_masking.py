"""Tests of the per-epoch masked-token dataset."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from epochal.data import EpochIndex, MaskedTokenDataset, MultiEpochDatasetResampler
from epochal.testing import (
    assert_dataset_compatible_with_megatron,
    assert_dataset_elements_not_equal,
)

MASK, CLS, EOS = 1, 2, 3
VOCAB = range(4, 30)


def make(seqs, **kw):
    return MaskedTokenDataset(
        seqs, mask_token_id=MASK, random_tokens=VOCAB, special_token_ids=[CLS, EOS], **kw
    )


@pytest.fixture(scope="module")
def seqs():
    rng = np.random.default_rng(0)
    return [np.concatenate([[CLS], rng.integers(4, 30, size=200), [EOS]]) for _ in range(8)]


def test_same_key_same_sample_and_epochs_differ(seqs):
    ds = make(seqs)
    a, b = ds[EpochIndex(0, 3)], ds[EpochIndex(0, 3)]
    for k in ("tokens", "labels", "loss_mask"):
        assert torch.equal(a[k], b[k])
    c = ds[EpochIndex(1, 3)]
    assert not torch.equal(a["loss_mask"], c["loss_mask"])
    same_tokens = make([seqs[0], seqs[0]])
    assert not torch.equal(same_tokens[(0, 0)]["loss_mask"], same_tokens[(0, 1)]["loss_mask"])
    assert not torch.equal(make(seqs, seed=7)[(0, 3)]["loss_mask"], a["loss_mask"])


def test_outputs_are_consistent(seqs):
    ds = make(seqs)
    for e in range(3):
        for i in range(len(seqs)):
            out = ds[EpochIndex(e, i)]
            orig = torch.as_tensor(seqs[i])
            sel = out["loss_mask"]
            assert out["tokens"].dtype == torch.int64 and sel.dtype == torch.bool
            assert torch.equal(out["labels"][sel], orig[sel])
            assert (out["labels"][~sel] == -100).all()
            assert torch.equal(out["tokens"][~sel], orig[~sel])
            assert not sel[0] and not sel[-1]  # CLS and EOS are never selected
            replaced = out["tokens"][sel]
            assert (
                (replaced == MASK) | ((replaced >= VOCAB.start) & (replaced < VOCAB.stop))
            ).all()


def test_masking_rates(seqs):
    ds = make(seqs * 20)
    sel = masked = replaced = kept = total = 0
    for i in range(len(ds)):
        out = ds[EpochIndex(0, i)]
        s = out["loss_mask"]
        total += s.numel() - 2
        sel += int(s.sum())
        new, orig = out["tokens"][s], torch.as_tensor(ds.dataset[i])[s]
        masked += int((new == MASK).sum())
        replaced += int(((new != MASK) & (new != orig)).sum())
        kept += int((new == orig).sum())
    assert abs(sel / total - 0.15) < 0.01, sel / total
    assert abs(masked / sel - 0.8) < 0.03, masked / sel
    # 10% random tokens (1 in 26 of them happens to draw the original token), 10% kept
    assert abs(replaced / sel - 0.1 * 25 / 26) < 0.02, replaced / sel
    assert abs(kept / sel - (0.1 + 0.1 / 26)) < 0.02, kept / sel


def test_extreme_probabilities(seqs):
    none = make(seqs, mask_prob=0.0)[(0, 0)]
    assert not none["loss_mask"].any()
    every = make(seqs, mask_prob=1.0, mask_token_prob=1.0, random_token_prob=0.0)[(0, 0)]
    assert every["loss_mask"][1:-1].all()
    assert (every["tokens"][1:-1] == MASK).all()
    same = make(seqs, mask_prob=1.0, mask_token_prob=0.0, random_token_prob=0.0)[(0, 0)]
    assert torch.equal(same["tokens"], torch.as_tensor(seqs[0]))


def test_accepts_lists_tensors_and_empty():
    ds = MaskedTokenDataset(
        [[5, 6, 7], torch.tensor([8, 9]), []], mask_token_id=0, random_tokens=[5]
    )
    assert ds[(0, 0)]["tokens"].shape == (3,)
    assert ds[(0, 1)]["tokens"].shape == (2,)
    assert ds[(0, 2)]["tokens"].shape == (0,)


def test_global_rng_untouched_and_megatron_compatible(seqs):
    ds = make(seqs)
    before = torch.get_rng_state()
    np_before = np.random.get_state()[1].copy()  # noqa: NPY002 - inspects the global state
    ds[EpochIndex(2, 5)]
    assert torch.equal(torch.get_rng_state(), before)
    assert np.array_equal(np.random.get_state()[1], np_before)  # noqa: NPY002
    assert_dataset_compatible_with_megatron(ds, index=EpochIndex(0, 1))
    assert_dataset_elements_not_equal(ds, EpochIndex(0, 1), EpochIndex(1, 1))


def test_resampled_loader_worker_counts_agree(seqs):
    r = MultiEpochDatasetResampler(make(seqs), num_epochs=3, seed=1)
    batches = {}
    for workers in (0, 2):
        loader = DataLoader(r, batch_size=4, num_workers=workers)
        batches[workers] = [b["tokens"] for b in loader]
    assert len(batches[0]) == 6
    assert all(torch.equal(x, y) for x, y in zip(batches[0], batches[2]))


def test_errors():
    with pytest.raises(ValueError, match="mask_prob"):
        make([[4]], mask_prob=1.5)
    with pytest.raises(ValueError, match="mask_token_prob"):
        make([[4]], mask_token_prob=-0.1)
    with pytest.raises(ValueError, match="<= 1"):
        make([[4]], mask_token_prob=0.8, random_token_prob=0.3)
    with pytest.raises(ValueError, match="random_tokens"):
        MaskedTokenDataset([[4]], mask_token_id=1, random_tokens=[])
    with pytest.raises(ValueError, match="seed"):
        make([[4]], seed=-1)
    bad = make([[[4, 5]], [4.5, 3.0], "abc"])
    for i in range(3):
        with pytest.raises(ValueError, match=f"item {i}"):
            bad[EpochIndex(0, i)]
    with pytest.raises(TypeError, match="EpochIndex"):
        make([[4]])[0]
