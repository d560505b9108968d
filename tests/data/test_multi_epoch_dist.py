"""Samples are identical on every rank, whatever each rank's global random state."""

import hashlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from epochal.data import (
    MaskedTokenDataset,
    MultiEpochDatasetResampler,
    PRNGResampleDataset,
    permute_array,
)
from tests.dist_utils import run_gloo


def _rank_digest(rank, world_size):
    # Each rank perturbs its global generators differently, as Megatron does per TP rank.
    torch.manual_seed(1000 + rank)
    np.random.seed(rank)  # noqa: NPY002
    seqs = [list(range(3 + i, 40 + i)) for i in range(11)]
    masked = MaskedTokenDataset(
        seqs, mask_token_id=0, random_tokens=range(1, 60), special_token_ids=[3]
    )
    resampler = MultiEpochDatasetResampler(masked, num_samples=50, seed=123)
    h = hashlib.sha256()
    for g in range(len(resampler)):  # every rank reads the whole run
        sample = resampler[g]
        for name in ("tokens", "labels", "loss_mask"):
            h.update(sample[name].numpy().tobytes())
    h.update(np.ascontiguousarray(resampler.epoch_indices(0, 50)).tobytes())
    h.update(
        PRNGResampleDataset(list(range(1000)), seed=9).sample_indices(np.arange(1000)).tobytes()
    )
    h.update(permute_array(np.arange(10_000), 10_000, 77).tobytes())
    digest = torch.tensor(list(h.digest()), dtype=torch.uint8)
    gathered = [torch.empty_like(digest) for _ in range(world_size)]
    dist.all_gather(gathered, digest)
    return [bytes(t.tolist()).hex() for t in gathered]


@pytest.mark.distributed
def test_same_samples_on_every_rank():
    results = run_gloo(_rank_digest, 2)
    assert results[0] == results[1]
    assert results[0][0] == results[0][1]
