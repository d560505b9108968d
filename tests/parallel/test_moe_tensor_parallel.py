"""A mixture-of-experts GPT under tensor (and sequence) parallelism equals one process.

Top-2 of 4 experts with a gated shared expert, the balance and z-losses on, no
dropout: 20 steps on two tensor-parallel ranks (TP2, and TP2 with sequence
parallelism) give the single-process losses, gradient norms, balance and z-losses
within the bound of the other tensor-parallel tests (``tests/parallel/harness.py``:
1e-5 absolute, the gradient norm relative to max(1, norm)), the same tokens per
expert, and final weights within its 1e-3. A checkpoint saved under TP2 after 10
steps resumes in one process and ends where the uninterrupted run ends.
"""

from __future__ import annotations

import pytest

from epochal.model.config import ConfigError
from epochal.train.state.checkpoint import step_folder_name
from tests.dist_utils import run_gloo
from tests.parallel import moe_tp_worker as M

pytestmark = pytest.mark.distributed

TP2 = ["--parallel.tensor_parallel=2"]
CASES = [
    ("tp2", [*TP2, "--checkpoint.save_interval=10"]),
    ("tp2-sp", [*TP2, "--parallel.sequence_parallel=true"]),
]
ATOL, PARAM_ATOL = 1e-5, 1e-3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-tp")
    one = M.single(str(root), "one")
    two = run_gloo(M.rank_main, 2, str(root), CASES, timeout=900)[0]
    return root, one, two


def _assert_close(got: dict, want: dict) -> None:
    assert len(want["losses"]) == 20
    assert got["losses"] == pytest.approx(want["losses"], abs=ATOL)
    assert len(got["records"]) == len(want["records"]) == 20
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


def test_moe_on_two_tensor_parallel_ranks_equals_one_process(runs):
    _, one, two = runs
    _assert_close(two["tp2"], one)
    assert two["tp2"]["losses"] != one["losses"]  # TP changes the matrix products: not a copy


def test_moe_with_sequence_parallelism_equals_one_process(runs):
    _, one, two = runs
    _assert_close(two["tp2-sp"], one)


def test_a_tp2_moe_checkpoint_resumes_in_one_process(runs):
    root, one, _ = runs
    checkpoint = root / "tp2" / "checkpoints" / step_folder_name(10)
    resumed = M.single(str(root), "tp2-on-one", [f"--checkpoint.resume={checkpoint}"])
    assert resumed["losses"] == pytest.approx(one["losses"][10:], abs=ATOL)
    for name, p in one["params"].items():
        assert abs(resumed["params"][name] - p).max() < PARAM_ATOL, name


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
