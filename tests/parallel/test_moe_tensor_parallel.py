"""A mixture-of-experts GPT under tensor (and sequence) parallelism equals one process.

Top-2 of 4 experts with a gated shared expert, the balance and z-losses on, no
dropout, ``invariance_worker.STEPS`` steps (20, or 10 in the default tier). In canonical
units (the layout-invariant default) TP2, TP2 with sequence parallelism and EP2 x TP2
(four ranks: expert parallelism over the data-parallel pair, two experts per rank, each
split over its tensor-parallel pair) give one process's losses, records (gradient
norms, balance and z-losses, tokens per expert) and final weights bit for bit. Without
layout invariance EP2 x TP2 with sequence parallelism stays within the bound of the
other tensor-parallel tests (``tests/parallel/harness.py``: 1e-5 absolute, the gradient
norm relative to max(1, norm); final weights within 1e-3). Checkpoints saved under TP2
and EP2 x TP2 half-way resume in one process and end where the uninterrupted run ends.
"""

from __future__ import annotations

import pytest

from epochal.model.config import ConfigError
from epochal.train.state.checkpoint import step_folder_name
from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W
from tests.parallel import moe_tp_worker as M

pytestmark = pytest.mark.distributed

TP2 = ["--parallel.tensor_parallel=2"]
EP2 = ["--parallel.expert_parallel=2"]
SP = ["--parallel.sequence_parallel=true"]
HALF = W.STEPS // 2
SAVE = [f"--checkpoint.save_interval={HALF}"]
ATOL, PARAM_ATOL = 1e-5, 1e-3


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-tp")
    return root, M.single(str(root), "one")


def _ranks(one, world: int, cases: list) -> tuple:
    root, single = one
    return root, single, run_gloo(M.rank_main, world, str(root), cases, timeout=900)[0]


@pytest.fixture(scope="module")
def runs(one):
    """TP2 with sequence parallelism (two ranks)."""
    return _ranks(one, 2, [("tp2-sp", [*TP2, *SP, *SAVE])])


@pytest.fixture(scope="module")
def ep_runs(one):
    """EP2 x TP2 (four ranks: two tensor-parallel ranks times two data-parallel ranks that are
    the two expert-parallel ranks; each holds two of the four experts, split over its TP pair)."""
    return _ranks(one, 4, [("ep2-tp2", [*TP2, *EP2, *SAVE])])


@pytest.fixture(scope="module")
def slow_runs(one):
    """The variants: TP2 without sequence parallelism; EP2 x TP2 with it, without layout
    invariance; TP2 x PP2."""
    _, _, two = _ranks(one, 2, [("tp2", TP2)])
    fast = [*TP2, *EP2, *SP, "--training.layout_invariant=false"]
    tp_pp = [*TP2, "--parallel.pipeline_parallel=2"]
    root, single, four = _ranks(one, 4, [("ep2-tp2-sp-fast", fast), ("tp2-pp2", tp_pp)])
    return root, single, {**two, **four}


def _assert_close(got: dict, want: dict) -> None:
    assert len(want["losses"]) == W.STEPS
    assert got["losses"] == pytest.approx(want["losses"], abs=ATOL)
    assert len(got["records"]) == len(want["records"]) == W.STEPS
    for step, (a, b) in enumerate(zip(want["records"], got["records"], strict=True)):
        assert set(a) == set(b)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], abs=ATOL * max(1.0, a["grad_norm"]))
        for key in a:
            if key.startswith("tokens_per_expert/"):
                assert b[key] == a[key], (step, key)  # the same routing
            else:
                assert b[key] == pytest.approx(a[key], abs=ATOL), (step, key)
    assert set(got["params"]) == set(want["params"])
    for name, p in want["params"].items():
        assert abs(got["params"][name] - p).max() < PARAM_ATOL, name


@pytest.mark.slow  # tensor parallelism of experts: the EP2 x TP2 tests below
def test_moe_with_sequence_parallelism_trains_the_bits_of_one_process(runs):
    _, one, two = runs
    _assert_same(two["tp2-sp"], one)  # canonical units: the layer computed whole, sliced


@pytest.mark.slow
def test_moe_on_two_tensor_parallel_ranks_equals_one_process(slow_runs):
    _, one, runs = slow_runs
    _assert_close(runs["tp2"], one)


def _assert_resumes_in_one_process(runs: tuple, name: str) -> None:
    """``name``'s checkpoint of the middle step resumed in one process ends where one process ends."""
    root, one, _ = runs
    checkpoint = root / name / "checkpoints" / step_folder_name(HALF)
    resumed = M.single(str(root), f"{name}-on-one", [f"--checkpoint.resume={checkpoint}"])
    assert resumed["losses"] == pytest.approx(one["losses"][HALF:], abs=ATOL)
    for key, p in one["params"].items():
        assert abs(resumed["params"][key] - p).max() < PARAM_ATOL, key


@pytest.mark.slow
def test_a_tp2_moe_checkpoint_resumes_in_one_process(runs):
    _assert_resumes_in_one_process(runs, "tp2-sp")


@pytest.mark.parametrize(
    ("option", "overrides"),
    [
        ("moe_ffn_hidden_size", dict(moe_ffn_hidden_size=15)),
        ("moe_shared_expert_intermediate_size", dict(moe_shared_expert_intermediate_size=9)),
    ],
)
def test_widths_tensor_parallelism_cannot_split_are_refused_by_name(option, overrides):
    from epochal.model.config import ModelConfig
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout

    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        num_experts=2,
        **overrides,
    )
    with pytest.raises(ConfigError, match=f"model.{option}.*parallel.tensor_parallel=2"):
        check_model_layout(cfg, ParallelDims(dp=1, tp=2, pp=1))
    check_model_layout(cfg, ParallelDims(dp=2, tp=1, pp=1))  # no tensor parallelism: fine


def test_moe_on_two_expert_times_two_tensor_parallel_ranks_trains_the_bits_of_one_process(ep_runs):
    # canonical units (the layout-invariant default): each expert and the shared expert
    # compute as the dense MLP does, their row products summed as the tree
    _, one, four = ep_runs
    assert four["ep2-tp2"]["experts_held"] == [2, 2]  # two experts per layer on each rank
    _assert_same(four["ep2-tp2"], one)


def _assert_same(got: dict, want: dict) -> None:
    assert len(want["losses"]) == W.STEPS
    assert got["losses"] == want["losses"]
    assert got["records"] == want["records"]  # gradient norms, balance and z-losses, routing
    assert set(got["params"]) == set(want["params"])
    for name, p in want["params"].items():
        assert (got["params"][name] == p).all(), name  # numpy arrays


@pytest.mark.slow
def test_ep_tp_with_sequence_parallelism_without_layout_invariance_equals_one_process(slow_runs):
    _, one, runs = slow_runs
    _assert_close(runs["ep2-tp2-sp-fast"], one)


def test_an_ep2_tp2_moe_checkpoint_resumes_in_one_process(ep_runs):
    _assert_resumes_in_one_process(ep_runs, "ep2-tp2")


@pytest.mark.slow
def test_moe_on_tensor_times_pipeline_parallel_ranks_equals_one_process(slow_runs):
    _, one, runs = slow_runs
    _assert_close(runs["tp2-pp2"], one)
