"""Checkpoints saved under one layout load under others; the next steps' losses equal the uninterrupted run's."""

from __future__ import annotations

import pytest

from epochal.model import GPTModel
from epochal.train.parallel_trainer import export_consolidated
from tests.parallel import harness as H

pytestmark = pytest.mark.distributed


def test_saved_under_tp2_pp2(four_rank_results):
    assert four_rank_results["reshard_save_tp2_pp2"] == []


def test_tp2_pp2_checkpoint_resumes_under_dp4_fsdp(four_rank_results):
    assert four_rank_results["reshard_tp2_pp2_to_dp4"] == []


def test_tp2_pp2_checkpoint_resumes_under_pp2_dp2_interleaved(four_rank_results):
    assert four_rank_results["reshard_tp2_pp2_to_pp2_dp2_interleaved"] == []


def test_tp2_pp2_checkpoint_resumes_in_one_process(four_rank_results, parallel_tmp):
    config = H.tiny_config()
    batches = H.global_batches(4, 8, seed=11)
    ref = H.reference_run(config, batches, 2)
    got = H.single_process_run(
        config, batches[2:], 2, load_dir=str(parallel_tmp / "tp2pp2" / "step_0000002")
    )
    assert got["losses"] == pytest.approx(ref["losses"][2:], abs=1e-5)


def test_single_process_checkpoint_resumes_under_pp2(two_rank_results):
    assert two_rank_results["reshard_single_to_pp2"] == []


def test_consolidated_export_of_a_tp2_pp2_checkpoint(four_rank_results, parallel_tmp, tmp_path):
    config = H.tiny_config()
    batches = H.global_batches(4, 8, seed=11)
    ref = H.reference_run(config, batches[:2], 2)
    out = tmp_path / "model.safetensors"
    shapes = export_consolidated(parallel_tmp / "tp2pp2" / "step_0000002", out)
    assert shapes["tok_embeddings.weight"] == (128, 32) and shapes["layers.3.mlp.fc2.weight"] == (
        32,
        128,
    )
    from epochal.parallel.checkpoint import load_consolidated

    model = GPTModel(config, seed=99)
    load_consolidated(out, model)
    for name, p in model.named_parameters():
        assert (p.detach() - ref["params"][name]).abs().max() < 1e-3, name
    assert model.output.weight is model.tok_embeddings.weight
