"""Dropout streams under tensor parallelism (Megatron's RNG tracker, epochal.parallel.rng)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from epochal.model import GPTModel
from epochal.parallel.rng import (
    apply_dropout_rng_regions,
    fork_rng_per_tp_rank,
    pipeline_stage_seed,
)
from tests.parallel import harness as H


def _dropout_net() -> nn.Module:
    net = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5), nn.Linear(64, 4))
    with torch.no_grad():
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.linspace(-1, 1, p.numel()).view_as(p) * (i + 1))
    return net


def _run(tp_rank: int | None, seed: int = 5, *, recompute: bool = False):
    """Output, input gradient and the default CPU generator's state after the call."""
    net = _dropout_net()
    if tp_rank is not None:
        fork_rng_per_tp_rank(net, tp_rank)
    x = torch.linspace(0, 1, 24).view(3, 8).requires_grad_(True)
    torch.manual_seed(seed)
    out = checkpoint(net, x, use_reentrant=False) if recompute else net(x)
    state = torch.get_rng_state()
    out.sum().backward()
    return out.detach(), x.grad, state


def test_tp_ranks_draw_different_masks_and_stay_in_step():
    out0, _, state0 = _run(0)
    out1, _, state1 = _run(1)
    assert not torch.equal(out0, out1)  # rank 1's shard does not replay rank 0's mask
    assert torch.equal(state0, state1)  # the shared stream advanced identically on both ranks
    again, _, _ = _run(0)
    assert torch.equal(out0, again)  # deterministic per (seed, rank)
    plain, _, _ = _run(None)
    torch.manual_seed(5)
    torch.empty((), dtype=torch.int64).random_()  # the one draw a forked region takes
    assert torch.equal(state0, torch.get_rng_state())
    assert not torch.equal(plain, out0)


def test_recompute_replays_the_same_masks():
    out, grad, _ = _run(1)
    out_rc, grad_rc, _ = _run(1, recompute=True)
    assert torch.equal(out, out_rc)
    assert torch.equal(grad, grad_rc)


def test_state_is_restored_when_the_forward_raises():
    class Boom(nn.Module):
        def forward(self, x):
            raise KeyError("boom")

    boom = Boom()
    fork_rng_per_tp_rank(boom, 1)
    torch.manual_seed(9)
    with pytest.raises(KeyError):
        boom(torch.zeros(1))
    torch.manual_seed(9)
    torch.empty((), dtype=torch.int64).random_()
    expected = torch.get_rng_state()
    torch.manual_seed(9)
    with pytest.raises(KeyError):
        boom(torch.zeros(1))
    assert torch.equal(torch.get_rng_state(), expected)


@pytest.mark.parametrize(
    ("hidden", "attention", "sp", "expected"),
    [(0.0, 0.0, True, 0), (0.0, 0.1, False, 2), (0.1, 0.0, False, 0), (0.1, 0.0, True, 3)],
)
def test_regions_follow_the_sharding(hidden, attention, sp, expected):
    model = GPTModel(
        H.tiny_config(num_layers=2, hidden_dropout=hidden, attention_dropout=attention)
    )
    assert apply_dropout_rng_regions(model, 0, sequence_parallel=sp) == expected


def test_pipeline_stage_seed_is_megatrons():
    assert [pipeline_stage_seed(1234, p) for p in range(3)] == [1234, 1334, 1434]


@pytest.mark.distributed
@pytest.mark.parametrize("name", ["tp2_dropout_streams", "tp2_dropout_streams_sp"])
def test_tp2_dropout_streams(two_rank_results, name):
    assert two_rank_results[name] == [], "\n".join(two_rank_results[name])
