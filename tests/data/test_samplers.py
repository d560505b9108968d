"""Megatron batch samplers against hand-computed batches, NeMo's algorithms and invariants."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochal.data import (
    PAD,
    MegatronPretrainingBatchSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    SamplerConfigError,
)
from epochal.data.epochs.permutation import derive_seed, permute_array


def _ranks(cls, *args, dp, **kwargs):
    """One sampler per data-parallel rank; ``args`` are the arguments before the rank."""
    return [cls(*args, data_parallel_rank=r, data_parallel_size=dp, **kwargs) for r in range(dp)]


def _global_sequence(samplers):
    """Interleave the ranks' micro-batches back into the global order of positions."""
    per_rank = [list(s) for s in samplers]
    assert len({len(p) for p in per_rank}) == 1, (
        "every rank must yield the same number of micro-batches"
    )
    out = []
    for step in zip(*per_rank):
        for mb in step:
            out.extend(mb)
    return out


# ----------------------------------------------------------------- sequential sampler
def test_sequential_hand_computed_dp2():
    r0, r1 = _ranks(MegatronPretrainingSampler, 10, 0, 2, dp=2)
    assert list(r0) == [[0, 1], [4, 5]]
    assert list(r1) == [[2, 3], [6, 7]]
    assert len(r0) == len(r1) == 2


def test_sequential_drop_last_false_and_empty_rank_gets_pad():
    r0, r1 = _ranks(MegatronPretrainingSampler, 10, 0, 2, dp=2, drop_last=False)
    assert list(r0) == [[0, 1], [4, 5], [8, 9]]
    assert list(r1) == [[2, 3], [6, 7], [PAD]]
    assert len(r0) == len(r1) == 3
    r0, r1 = _ranks(MegatronPretrainingSampler, 11, 0, 2, dp=2, drop_last=False)
    assert list(r0)[-1] == [8, 9] and list(r1)[-1] == [10]


def test_sequential_global_batch_truncation_and_padding():
    # 11 samples, gbs 8, mbs 2, dp 2: one complete global batch (positions 0..7).
    r0, r1 = _ranks(MegatronPretrainingSampler, 11, 0, 2, dp=2, global_batch_size=8)
    assert list(r0) == [[0, 1], [4, 5]] and list(r1) == [[2, 3], [6, 7]]
    assert len(r0) == 2
    # padded to two whole global batches: positions 11..15 are PAD, never a negative index
    r0, r1 = _ranks(
        MegatronPretrainingSampler,
        11,
        0,
        2,
        dp=2,
        global_batch_size=8,
        drop_last=False,
        pad_samples_to_global_batch_size=True,
    )
    assert list(r0) == [[0, 1], [4, 5], [8, 9], [PAD, PAD]]
    assert list(r1) == [[2, 3], [6, 7], [10, PAD], [PAD, PAD]]
    assert len(r0) == 4
    for mb in list(r0) + list(r1):
        assert all(i is PAD or (isinstance(i, int) and i >= 0) for i in mb)
    # no padding needed when the data is a whole number of global batches
    (s,) = _ranks(
        MegatronPretrainingSampler,
        8,
        0,
        2,
        dp=1,
        global_batch_size=4,
        drop_last=False,
        pad_samples_to_global_batch_size=True,
    )
    assert list(s) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_sequential_padding_counts_as_consumed_and_resumes_inside_it():
    # 11 samples, gbs 8, mbs 2, dp 2, padded: positions 11..15 complete the last global batch
    kw = {"drop_last": False, "global_batch_size": 8, "pad_samples_to_global_batch_size": True}
    full = [list(s) for s in _ranks(MegatronPretrainingSampler, 11, 0, 2, dp=2, **kw)]
    s = MegatronPretrainingSampler(11, 0, 2, 0, 2, **kw)
    # the padded step counts whole, as the step count does (2 steps of 8 = 16)
    assert [s.consumed_after(0, k) for k in range(5)] == [0, 4, 8, 12, 16]
    for rank in range(2):  # resume after the first micro-batch of padding
        resumed = MegatronPretrainingSampler(11, 12, 2, rank, 2, **kw)
        assert list(resumed) == full[rank][3:] == [[PAD, PAD]]
        assert resumed.remaining(12) == 1
    done = MegatronPretrainingSampler(11, 16, 2, 0, 2, **kw)
    assert list(done) == [] and done.remaining(16) == 0
    with pytest.raises(SamplerConfigError, match="beyond the end"):
        MegatronPretrainingSampler(11, 17, 2, 0, 2, **kw)


def test_sequential_rampup_truncation():
    # ramp 2 -> 4 over 4 samples, mbs 1, dp 1, 11 samples; drop_last keeps whole steps only
    (s,) = _ranks(
        MegatronPretrainingSampler, 11, 0, 1, dp=1, global_batch_size=4, rampup_batch_size=[2, 2, 4]
    )
    # schedule: 0:+2 ->2 (gbs 2), 2:+2 ->4 (int(2/4)=0 -> 2), 4:+4 (int(4/4)=1 -> 4) -> 8, 8:+4 -> 12 > 11
    assert [mb[0] for mb in s] == list(range(8))
    assert len(s) == 8


def test_sequential_resume_len_constant_and_tail_equal():
    full = MegatronPretrainingSampler(100, 0, 3, 1, 2)
    batches = list(full)
    for consumed in (0, 6, 42, 96):
        resumed = MegatronPretrainingSampler(100, consumed, 3, 1, 2)
        assert len(resumed) == len(full) == 16  # does not shrink on resume
        assert list(resumed) == batches[consumed // 6 :]
        assert resumed.remaining(consumed) == len(batches) - consumed // 6
    assert MegatronPretrainingSampler(100, 100, 3, 0, 2).remaining(100) == 0
    assert list(MegatronPretrainingSampler(100, 100, 3, 0, 2)) == []
    assert full.consumed_after(6, 3) == 24
    assert MegatronPretrainingSampler(11, 0, 2, 0, 2, drop_last=False).consumed_after(8, 1) == 11


def test_sequential_global_order_does_not_depend_on_dp():
    ref = _global_sequence(_ranks(MegatronPretrainingSampler, 48, 0, 2, dp=1, global_batch_size=8))
    for dp, mbs in ((2, 2), (4, 1), (2, 4)):
        got = _global_sequence(
            _ranks(MegatronPretrainingSampler, 48, 0, mbs, dp=dp, global_batch_size=8)
        )
        assert got == ref


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"total_samples": 0}, "total_samples"),
        ({"consumed_samples": -1}, "consumed_samples"),
        ({"consumed_samples": 11}, "beyond the end"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"data_parallel_size": 0}, "data_parallel_size"),
        ({"data_parallel_rank": 2}, "must be < data_parallel_size"),
        ({"data_parallel_rank": -1}, "data_parallel_rank"),
        ({"global_batch_size": 6}, "divisible"),
        ({"drop_last": 1}, "drop_last must be a bool"),
        ({"pad_samples_to_global_batch_size": True}, "needs global_batch_size"),
        (
            {"pad_samples_to_global_batch_size": True, "global_batch_size": 8},
            "needs drop_last=False",
        ),
        ({"rampup_batch_size": [2, 2, 4]}, "needs global_batch_size"),
        ({"global_batch_size": 8, "rampup_batch_size": [2, 2, 4]}, "not divisible"),
        ({"micro_batch_size": 1.5}, "micro_batch_size"),
    ],
)
def test_sequential_errors(kwargs, needle):
    args = {
        "total_samples": 10,
        "consumed_samples": 0,
        "micro_batch_size": 2,
        "data_parallel_rank": 0,
        "data_parallel_size": 2,
    }
    args.update(kwargs)
    with pytest.raises(SamplerConfigError, match=needle):
        MegatronPretrainingSampler(**args)


# ----------------------------------------------------------------- random sampler
def _nemo_random_reference(total, consumed, mbs, rank, dp, seed=0):
    """NeMo 2's MegatronPretrainingRandomSampler.__iter__ (one pass), written out for the test."""
    block = mbs * dp
    active = total - total % block
    epoch, offset = divmod(consumed, active)
    bucket_size = (total // block) * mbs
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(bucket_size, generator=g).tolist()
    idx = [rank * bucket_size + x for x in order[offset // dp :]]
    return [idx[i : i + mbs] for i in range(0, len(idx) - mbs + 1, mbs)]


@pytest.mark.parametrize(
    ("total", "mbs", "dp", "consumed", "seed"),
    [
        (10, 2, 2, 0, 0),
        (10, 2, 2, 4, 0),
        (37, 3, 2, 0, 5),
        (37, 3, 2, 66, 5),
        (64, 4, 4, 128, 1),
    ],
)
def test_random_bucket_matches_nemo(total, mbs, dp, consumed, seed):
    for rank in range(dp):
        s = MegatronPretrainingRandomSampler(total, consumed, mbs, rank, dp, seed=seed)
        assert list(s) == _nemo_random_reference(total, consumed, mbs, rank, dp, seed)
        assert len(s) == total // (mbs * dp)  # a whole epoch, whatever consumed is


def test_random_bucket_epochs_and_dp_dependence():
    dp, mbs, n = 2, 2, 20
    ranks = _ranks(MegatronPretrainingRandomSampler, n, 0, mbs, dp=dp)
    epoch0 = _global_sequence(ranks)
    assert sorted(epoch0) == list(range(n))
    for s in ranks:
        s.consumed_samples = n  # next epoch
    epoch1 = _global_sequence(ranks)
    assert sorted(epoch1) == list(range(n)) and epoch1 != epoch0
    # Megatron's buckets: the global order changes with the data-parallel size (why global_shuffle exists)
    assert _global_sequence(_ranks(MegatronPretrainingRandomSampler, n, 0, mbs * 2, dp=1)) != epoch0


def _megatron_unsharded_reference(total, consumed, mbs, rank, dp, seed=0):
    """Megatron-LM's MegatronPretrainingRandomSampler.__iter__ with data_sharding=False
    (one pass; Megatron seeds with the epoch, i.e. our seed 0), written out for the test."""
    block = mbs * dp
    active = total - total % block
    epoch, offset = divmod(consumed, active)
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm((total // mbs) * mbs, generator=g).tolist()
    idx = order[offset:][rank::dp]
    return [idx[i : i + mbs] for i in range(0, len(idx) - mbs + 1, mbs)]


@pytest.mark.parametrize(
    ("total", "mbs", "dp", "consumed"),
    [(10, 2, 2, 0), (10, 2, 2, 4), (37, 3, 2, 66), (64, 4, 4, 128), (41, 2, 4, 8)],
)
def test_random_unsharded_matches_megatron(total, mbs, dp, consumed):
    for rank in range(dp):
        s = MegatronPretrainingRandomSampler(total, consumed, mbs, rank, dp, data_sharding=False)
        assert list(s) == _megatron_unsharded_reference(total, consumed, mbs, rank, dp)
    ranks = _ranks(MegatronPretrainingRandomSampler, total, 0, mbs, dp=dp, data_sharding=False)
    epoch = _global_sequence(ranks)
    assert len(epoch) == len(set(epoch)) == total - total % (mbs * dp)


def test_random_unsharded_stops_every_rank_at_the_epoch_end():
    # 5 samples, mbs 1, dp 2: Megatron gives rank 0 three micro-batches (positions 0, 2
    # and the skipped remainder 4) but rank 1 two; here both get two.
    r0, r1 = _ranks(MegatronPretrainingRandomSampler, 5, 0, 1, dp=2, data_sharding=False)
    assert len(_megatron_unsharded_reference(5, 0, 1, 0, 2)) == 3
    assert len(list(r0)) == len(list(r1)) == len(r0) == 2


def test_random_unsharded_global_batches_do_not_depend_on_dp():
    n, gbs = 48, 8
    steps = {}
    for dp, mbs in ((1, 2), (2, 2), (4, 2), (1, 4), (2, 4), (8, 1)):
        ranks = _ranks(
            MegatronPretrainingRandomSampler,
            n,
            16,  # resumed two steps in
            mbs,
            dp=dp,
            global_batch_size=gbs,
            seed=7,
            data_sharding=False,
        )
        seq = _global_sequence(ranks)
        steps[dp, mbs] = [sorted(seq[i : i + gbs]) for i in range(0, len(seq), gbs)]
        assert len(steps[dp, mbs]) == 4
    ref = steps[1, 2]
    assert all(v == ref for v in steps.values()), steps
    # unlike the bucketed (sharded) shuffle
    sharded = [
        _global_sequence(
            _ranks(MegatronPretrainingRandomSampler, n, 16, 2, dp=dp, global_batch_size=gbs, seed=7)
        )
        for dp in (1, 2)
    ]
    assert sorted(sharded[0][:gbs]) != sorted(sharded[1][:gbs])


def test_random_unit_is_global_batch_when_given():
    # 22 samples, gbs 8: epochs of 16 samples (Megatron alone would use 20 = 22 - 22 % 4)
    s = MegatronPretrainingRandomSampler(22, 0, 2, 0, 2, global_batch_size=8)
    assert s.active_total_samples == 16 and len(s) == 4 and s.last_batch_size == 6
    assert s.epoch_at(16) == 1 and s.consumed_after(8, 5) == 16 and s.remaining(8) == 2


@pytest.mark.parametrize("seed", [0, 3])
def test_random_global_shuffle_independent_of_dp_and_mbs(seed):
    n, gbs = 30, 8
    ref = None
    for dp, mbs in ((1, 8), (1, 2), (2, 2), (4, 1), (2, 4), (8, 1)):
        seq = []
        ranks = _ranks(
            MegatronPretrainingRandomSampler,
            n,
            0,
            mbs,
            dp=dp,
            global_batch_size=gbs,
            seed=seed,
            global_shuffle=True,
        )
        for epoch in range(3):
            for s in ranks:
                s.consumed_samples = epoch * 24
            seq.extend(_global_sequence(ranks))
        if ref is None:
            ref = seq
        assert seq == ref, (dp, mbs)
    # hand-computed: epoch e uses the first 24 entries of the O(1) permutation of range(30)
    for epoch in range(3):
        perm = permute_array(np.arange(24), n, derive_seed(seed, epoch)).tolist()
        assert ref[epoch * 24 : (epoch + 1) * 24] == perm
        assert len(set(perm)) == 24
    assert ref[:24] != ref[24:48]  # reshuffled every epoch


def test_random_global_shuffle_resume_and_drop_last_false():
    full = MegatronPretrainingRandomSampler(
        30, 0, 2, 1, 2, global_batch_size=4, global_shuffle=True
    )
    batches = list(full)
    resumed = MegatronPretrainingRandomSampler(
        30, 12, 2, 1, 2, global_batch_size=4, global_shuffle=True
    )
    assert list(resumed) == batches[3:] and len(resumed) == len(full) == 7
    # drop_last=False keeps the 2-sample remainder as a last short micro-block: rank 1 gets PAD
    r0, r1 = _ranks(
        MegatronPretrainingRandomSampler,
        30,
        0,
        2,
        dp=2,
        global_batch_size=4,
        global_shuffle=True,
        drop_last=False,
    )
    b0, b1 = list(r0), list(r1)
    assert len(b0) == len(b1) == len(r0) == 8 and b1[-1] == [PAD] and len(b0[-1]) == 2
    assert sorted(i for mb in b0 + b1 for i in mb if i is not PAD) == list(range(30))
    assert r0.consumed_after(28, 1) == 30 and r0.epoch_at(30) == 1


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"pad_samples_to_global_batch_size": True}, "does not pad"),
        ({"global_shuffle": True}, "needs global_batch_size"),
        ({"global_batch_size": 32}, "smaller than one global batch"),
        ({"total_samples": 3}, "smaller than one micro_batch_size"),
        ({"drop_last": False, "total_samples": 21}, "needs global_shuffle=True"),
        ({"consumed_samples": 2}, "not a multiple"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"global_shuffle": 1, "global_batch_size": 4}, "global_shuffle must be a bool"),
        ({"data_sharding": 0}, "data_sharding must be a bool"),
        (
            {"data_sharding": False, "global_shuffle": True, "global_batch_size": 4},
            "choose one",
        ),
    ],
)
def test_random_errors(kwargs, needle):
    args = {
        "total_samples": 20,
        "consumed_samples": 0,
        "micro_batch_size": 2,
        "data_parallel_rank": 0,
        "data_parallel_size": 2,
    }
    args.update(kwargs)
    with pytest.raises(SamplerConfigError, match=needle):
        MegatronPretrainingRandomSampler(**args)


def test_random_invalid_position_at_iteration():
    s = MegatronPretrainingRandomSampler(20, 0, 2, 0, 2)
    s.consumed_samples = 6  # set by a loader: not a micro-block boundary (4)
    with pytest.raises(SamplerConfigError, match="not a multiple"):
        list(s)


# ----------------------------------------------------------------- batch sampler
def test_batch_sampler_hand_computed():
    r0, r1 = _ranks(MegatronPretrainingBatchSampler, 11, 0, 1, 4, dp=2)
    assert list(r0) == [[0, 2], [4, 6]] and list(r1) == [[1, 3], [5, 7]]
    assert len(r0) == 2
    r0, r1 = _ranks(
        MegatronPretrainingBatchSampler,
        11,
        0,
        1,
        4,
        dp=2,
        drop_last=False,
        pad_samples_to_global_batch_size=True,
    )
    assert list(r0) == [[0, 2], [4, 6], [8, 10]] and list(r1) == [[1, 3], [5, 7], [9, PAD]]
    assert len(r0) == 3
    assert r0.consumed_after(0, 3) == 12  # the padded global batch counts whole
    assert list(MegatronPretrainingBatchSampler(11, 12, 1, 4, 0, 2, False, True)) == []
    with pytest.raises(SamplerConfigError, match="beyond the end"):
        MegatronPretrainingBatchSampler(11, 13, 1, 4, 0, 2, False, True)
    (s,) = _ranks(MegatronPretrainingBatchSampler, 11, 8, 1, 4, dp=1, drop_last=False)
    assert list(s) == [[8, 9, 10]] and s.consumed_after(8, 1) == 11
    # empty local share of a short last global batch
    (s,) = _ranks(MegatronPretrainingBatchSampler, 9, 8, 1, 4, dp=2, drop_last=False)[1:]
    assert list(s) == [[PAD]]


def test_batch_sampler_rampup_and_resume():
    (s,) = _ranks(MegatronPretrainingBatchSampler, 30, 0, 1, 8, dp=1, rampup_batch_size=[4, 4, 8])
    # schedule: 0:+4, 4:+4 (int(4/8)=0), 8:+8 (int(8/8)=1 -> 8), 16:+8, 24:+8 > 30 -> stop
    assert [len(b) for b in s] == [4, 4, 8, 8] and len(s) == 4
    assert [b[0] for b in s] == [0, 4, 8, 16]
    resumed = MegatronPretrainingBatchSampler(30, 8, 1, 8, 0, 1, rampup_batch_size=[4, 4, 8])
    assert list(resumed) == list(s)[2:]
    assert s.consumed_after(0, 3) == 16 and s.remaining(8) == 2
    with pytest.raises(SamplerConfigError, match="global-batch boundary"):
        MegatronPretrainingBatchSampler(30, 6, 1, 8, 0, 1, rampup_batch_size=[4, 4, 8])
    with pytest.raises(SamplerConfigError, match="needs global_batch_size"):
        MegatronPretrainingBatchSampler(30, 0, 1, None, 0, 1)
    with pytest.raises(SamplerConfigError, match="beyond the end"):
        MegatronPretrainingBatchSampler(30, 31, 1, 8, 0, 1)
