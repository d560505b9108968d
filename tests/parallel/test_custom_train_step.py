"""Accelerate's custom-loss train step (imports changed only) gives the same losses under TP2, PP2 and DP2.

Issue 14's test: the per-token losses come vocabulary-parallel under tensor
parallelism, from the pipeline's last stage under pipeline parallelism, and the
loss function's ``avg_losses_across_data_parallel_group`` averages over the
data-parallel group.
"""

from __future__ import annotations

import pytest
import torch

from tests.dist_utils import run_gloo
from tests.parallel import custom_step_worker as W

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "tp2": ["--parallel.tensor_parallel=2", "--parallel.sequence_parallel=true"],
    "pp2": ["--parallel.pipeline_parallel=2", "--parallel.pipeline_schedule=1f1b"],
    "dp2": ["--parallel.data_parallel=2"],
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return W.single(str(tmp_path_factory.mktemp("single")))


def _layouts(slow: set[str]) -> list:
    """The layout names, those in ``slow`` in the slow tier (the others cover their code)."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in sorted(LAYOUTS)]


# TP2's custom step is also run by the evaluation test; DP2's gather by the loss test
@pytest.mark.parametrize("name", _layouts({"tp2"}))
def test_custom_loss_step_layout_equals_single_process(name, reference, tmp_path):
    ranks = run_gloo(W.rank_main, 2, str(tmp_path), LAYOUTS[name])
    for out in ranks:  # every rank reports the global numbers
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)
    assert ranks[0]["lm"] == pytest.approx(reference["lm"], abs=1e-5)
    assert reference["lm"] == pytest.approx(reference["losses"], rel=1e-6)


@pytest.fixture(scope="module")
def eval_reference(tmp_path_factory):
    return W.single_eval_logits(str(tmp_path_factory.mktemp("single_eval")))


def test_single_process_eval_logits_are_the_models_logits(eval_reference):
    logits = torch.from_numpy(eval_reference["logits"])
    # eval_iters=1 global batch of 8 samples, micro-batches of 2, padded vocabulary.
    assert logits.shape[0] == 8 and logits.shape[1] == 16 and logits.shape[2] >= 96
    assert torch.equal(logits, torch.from_numpy(eval_reference["forward"]))
    logged = eval_reference["logged"]
    assert 0.0 <= logged["accuracy"] <= 1.0
    assert set(logged) >= {"accuracy", "lm loss"}


@pytest.mark.parametrize("name", _layouts({"dp2"}))
def test_eval_logits_layout_equals_single_process(name, eval_reference, tmp_path):
    """Last-stage logits gathered over data-parallel ranks equal one process's, as does the metric."""
    ranks = run_gloo(W.rank_eval_logits, 2, str(tmp_path), LAYOUTS[name])
    holders = [out for out in ranks if out["logits"] is not None]
    assert len(holders) == (1 if name == "pp2" else 2)  # PP: only the last stage has logits
    for out in holders:
        torch.testing.assert_close(
            torch.from_numpy(out["logits"]),
            torch.from_numpy(eval_reference["logits"]),
            atol=1e-5,
            rtol=1e-5,
        )
    for out in ranks:  # every rank reports the averaged metric
        assert out["logged"]["accuracy"] == pytest.approx(eval_reference["logged"]["accuracy"])
