"""A mixture-of-experts GPT under context parallelism: one process's losses and records.

The tiny MoE GPT of ``test_moe_layouts.py`` (4 experts, top-2, the balance and
z-losses on) with dropout off trains ``invariance_worker.STEPS`` steps (20, or 10 in the default tier) in one process and at
``parallel.context_parallel=2`` on two ranks (each holds half of every sequence; the
expert counts and the token total of the balance loss are summed over the two, as
Megatron-Core does over its TP x CP group): the training losses, the evaluations,
the balance and z-loss records and the tokens per expert agree within 1e-5 relative
(context parallelism changes the sums, as tensor parallelism does). The slow tier runs
CP2 x EP2 on four ranks (tokens of each rank's chunk travel to their experts), and TP2 x
CP2.
"""

from __future__ import annotations

import json

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W
from tests.parallel.test_moe_layouts import MOE

pytestmark = pytest.mark.distributed

NO_DROPOUT = ["--model.hidden_dropout=0.0", "--model.attention_dropout=0.0"]
CP2 = [*MOE, *NO_DROPOUT, "--parallel.context_parallel=2"]
REL = 1e-5


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= REL * abs(y) for x, y in zip(a, b))


def _records(folder) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "train"]


def _moe_keys(record: dict) -> list[str]:
    return sorted(
        k for k in record if k.startswith(("load_balancing", "z_loss", "tokens_per_expert"))
    )


def _assert_matches(one: dict, got: dict, one_dir, got_dir) -> None:
    assert len(one["losses"]) == W.STEPS
    assert _close(got["losses"], one["losses"]), (got["losses"], one["losses"])
    assert _close(got["eval"], one["eval"]) and len(one["eval"]) == 2
    ref, run = _records(one_dir), _records(got_dir)
    assert len(ref) == len(run) == W.STEPS
    keys = _moe_keys(ref[0])
    assert "load_balancing_loss/layer_1" in keys and "tokens_per_expert/layer_0/expert_3" in keys
    for a, b in zip(run, ref):
        assert _moe_keys(a) == keys
        assert _close([a[k] for k in keys], [b[k] for k in keys]), (a, b)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("moe-cp")


@pytest.fixture(scope="module")
def one(root):
    return W.single(str(root), "dp1", "gpt", [*MOE, *NO_DROPOUT])


def test_moe_at_cp2_trains_one_process_losses_and_balance_records(root, one):
    two = run_gloo(W.rank_main, 2, str(root), [("cp2", "gpt", CP2)], timeout=600)
    for result in two:
        _assert_matches(one, result["cp2"], root / "dp1", root / "cp2")


@pytest.mark.slow
def test_moe_at_cp2_x_ep2_and_tp2_x_cp2_trains_one_process_losses_and_balance_records(root, one):
    cases = [
        ("cp2ep2", "gpt", [*CP2, "--parallel.expert_parallel=2"]),
        # each tensor-parallel rank's heads exchanged over its context-parallel group, the
        # experts' linears split over the tensor-parallel ranks
        ("tp2cp2", "gpt", [*CP2, "--parallel.tensor_parallel=2"]),
    ]
    four = run_gloo(W.rank_main, 4, str(root), cases, timeout=900)
    for result in four:
        for name, _, _ in cases:
            _assert_matches(one, result[name], root / "dp1", root / name)
