"""Elastic resume: 2 data-parallel gloo processes -> stop -> 1 process (and the reverse), same global order."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from epochal.data import MegatronDataSampler, WrappedDataLoader
from tests.data.resumable_helpers import ToyGPTDataset, ids_of
from tests.dist_utils import run_gloo

TOTAL_STEPS, STOP_AT = 9, 4
CONFIGS = {
    # in-order single pass over 80 samples, ramping the global batch from 4 to 8
    "single_rampup": ({"global_batch_size": 8, "rampup_batch_size": [4, 4, 16]}, 80),
    # reshuffled epochs of 40 samples (44 - 44 % 8) with the order independent of the DP size
    "cyclic_global_shuffle": (
        {"global_batch_size": 8, "dataloader_type": "cyclic", "global_shuffle": True, "seed": 11},
        44,
    ),
}


def _run_steps(config, rank, world, steps, state=None):
    """Train-loop data access for ``steps`` steps; returns (global id order per step, loader state)."""
    options, n = CONFIGS[config]
    sampler = MegatronDataSampler(
        seq_len=6, micro_batch_size=2, data_parallel_rank=rank, data_parallel_size=world, **options
    )
    loader = sampler.transform_dataloader(WrappedDataLoader(ToyGPTDataset(n), mode="train"))
    if state is not None:
        loader.load_state_dict(state)
    stream = loader.stream()
    sequence = []
    for _ in range(steps):
        mine = [
            ids_of(next(stream))
            for _ in range(sampler.num_microbatches_at(loader.consumed_samples))
        ]
        if world > 1:
            everyone = [None] * world
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        # global order: micro-batch j of rank 0, of rank 1, ... then micro-batch j + 1
        sequence.append([i for j in range(len(mine)) for r in range(world) for i in everyone[r][j]])
    return sequence, loader.state_dict()


def _two_ranks(rank, world, states_from_one_rank):
    """On 2 gloo ranks: (a) the first STOP_AT steps from scratch, (b) resume 1-rank states."""
    out = {}
    for config in CONFIGS:
        fresh, state = _run_steps(config, rank, world, STOP_AT)
        resumed, _ = _run_steps(
            config, rank, world, TOTAL_STEPS - STOP_AT, states_from_one_rank[config]
        )
        out[config] = (fresh, state, resumed)
    return out


@pytest.mark.distributed
def test_elastic_resume_keeps_the_global_order():
    reference = {c: _run_steps(c, 0, 1, TOTAL_STEPS)[0] for c in CONFIGS}
    assert [len(s) for s in reference["single_rampup"]][:5] == [4, 4, 4, 4, 8]  # ramp-up visible
    one_rank = {c: _run_steps(c, 0, 1, STOP_AT) for c in CONFIGS}
    for c in CONFIGS:
        assert one_rank[c][0] == reference[c][:STOP_AT]

    results = run_gloo(_two_ranks, 2, {c: one_rank[c][1] for c in CONFIGS})
    for c in CONFIGS:
        (fresh0, state0, resumed0), (fresh1, state1, resumed1) = results[0][c], results[1][c]
        assert fresh0 == fresh1 == reference[c][:STOP_AT], c  # 2 ranks see the 1-rank order
        assert state0 == state1 == one_rank[c][1], c  # same global position on every rank
        assert resumed0 == resumed1 == reference[c][STOP_AT:], c  # 1 -> 2 ranks
        # 2 -> 1 rank: resume the 2-rank state in one process
        tail, _ = _run_steps(c, 0, 1, TOTAL_STEPS - STOP_AT, state0)
        assert tail == reference[c][STOP_AT:], c
    seq = [i for step in reference["cyclic_global_shuffle"] for i in step]
    # no repeats within an epoch (72 samples: one epoch of 40, then 32 of the next)
    assert len(seq) == 72 and len(set(seq[:40])) == 40 and len(set(seq[40:])) == 32
    assert seq[40:] != seq[:32]  # reshuffled every epoch
