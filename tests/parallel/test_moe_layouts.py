"""A mixture-of-experts GPT under the parallel layouts: the bits of one process.

The tiny GPT of the layout-invariance tests with 4 experts, top-2 routing, the
balance and z-losses on (and dropout on) trains ``invariance_worker.STEPS`` steps (20, or 10 in the default tier) in one process (DP1 x GA4),
on two data-parallel ranks (DP2 x GA2) and on two pipeline stages (PP2 x GA4): the
loss of every step (the steps after a mid-run evaluation included), the evaluations
and the final model and optimizer state are bit-identical. Tensor parallelism: ``test_moe_tensor_parallel.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W

pytestmark = pytest.mark.distributed

MOE = [
    "--model.num_experts=4",
    "--model.moe_router_topk=2",
    "--model.moe_ffn_hidden_size=32",
    "--model.moe_aux_loss_coeff=0.01",
    "--model.moe_z_loss_coeff=0.001",
]  # evaluations half-way and at the end: the training step after an evaluation is checked too


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-layouts")
    one = W.single(str(root), "dp1", "gpt", MOE)
    cases = [("dp2", "gpt", MOE), ("pp2", "gpt", [*MOE, "--parallel.pipeline_parallel=2"])]
    two = run_gloo(W.rank_main, 2, str(root), cases, timeout=600)[0]
    return root, one, two


def test_moe_on_two_data_parallel_ranks_trains_the_bits_of_one_process(runs):
    _, one, two = runs
    assert len(one["losses"]) == W.STEPS
    assert two["dp2"]["losses"] == one["losses"]
    assert two["dp2"]["eval"] == one["eval"] and len(one["eval"]) == 2
    assert two["dp2"]["logged"] == one["logged"]
    assert two["dp2"]["digest"] == one["digest"]


def test_moe_on_two_pipeline_stages_trains_the_bits_of_one_process(runs):
    _, one, two = runs
    assert two["pp2"]["losses"] == one["losses"]  # step 11 follows an evaluation
    assert two["pp2"]["eval"] == one["eval"]
    assert two["pp2"]["logged"] == one["logged"]  # every layer's records, from both stages
    assert two["pp2"]["digest"] == one["digest"]


def test_the_records_hold_the_balance_loss_per_layer_and_tokens_per_expert(runs):
    root, one, _ = runs
    records = [
        json.loads(line) for line in (root / "dp1" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if r.get("kind") == "train"]
    assert len(train) == W.STEPS
    first = train[0]
    assert first["load_balancing_loss"] > 0.9  # 1.0 when perfectly balanced
    for layer in (0, 1):
        assert f"load_balancing_loss/layer_{layer}" in first
        shares = [first[f"tokens_per_expert/layer_{layer}/expert_{e}"] for e in range(4)]
        assert sum(shares) == pytest.approx(1.0)
    assert "z_loss" in first
    assert "load_balancing_loss" in one["logged"]  # evaluations record it too
