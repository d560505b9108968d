"""BERT and ESM under every parallel layout give the single-process losses (within 1e-5).

The model is a tiny BERT; the data is BioNeMo's way (``MaskedTokenDataset``
under ``MultiEpochDatasetResampler``: fresh masks per epoch). ``pairs`` adds
Megatron's pair inputs (token types, the binary head against ``is_random``,
padding) and the original post-LN blocks. The evaluation's masked-LM loss,
accuracy and perplexity must agree too. ESM trains on ``epochal train``'s own protein
path (synthetic FASTA -> BioNeMo's layout -> BioNeMo's samples, padded) under DP, DP with
recompute, TP and PP, and a checkpoint of one process resumes on two data-parallel
ranks with the same global order. ESM has no sequence parallelism (refused).
"""

from __future__ import annotations

import pytest
import torch
from torch.torch_version import TorchVersion

from epochal.model import ConfigError
from epochal.parallel.model_support import MIN_TORCH
from tests.dist_utils import run_gloo
from tests.parallel import bert_worker as W

pytestmark = pytest.mark.distributed

DP2 = ["--parallel.data_parallel=2"]
INTERLEAVED = [
    "--parallel.pipeline_parallel=2",
    "--parallel.virtual_pipeline=2",
    "--parallel.pipeline_schedule=interleaved_1f1b",
]
# name -> (model / data overrides shared with the reference, layout overrides)
# (data parallelism with each sharding mode is checked bit for bit, BERT and ESM-2, by
# tests/parallel/test_layout_invariance.py)
LAYOUTS = {
    "dp2_recompute": ([], [*DP2, "--parallel.recompute_granularity=full"]),
    "tp2": ([], ["--parallel.tensor_parallel=2"]),
    "pairs_tp2_sp": (
        W.PAIRS,
        ["--parallel.tensor_parallel=2", "--parallel.sequence_parallel=true"],
    ),
    "pairs_pp2": (W.PAIRS, ["--parallel.pipeline_parallel=2"]),
    "pairs_pp2_interleaved": ([*W.PAIRS, "--training.micro_batch_size=1"], INTERLEAVED),
}

ESM_LAYOUTS = {
    "esm_dp2_recompute": [*DP2, "--parallel.recompute_granularity=full"],
    "esm_tp2": ["--parallel.tensor_parallel=2"],
    "esm_pp2": ["--parallel.pipeline_parallel=2"],
}


@pytest.fixture(scope="module")
def esm_overrides(tmp_path_factory) -> list[str]:
    """ESM overrides with one protein cache for the module (written by the first run)."""
    return W.esm(str(tmp_path_factory.mktemp("esm-cache")))


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    cache = {}

    def get(shared: list[str]):
        key = tuple(shared)
        if key not in cache:
            cache[key] = W.single(str(tmp_path_factory.mktemp("single")), shared)
        return cache[key]

    return get


# plain TP2 is inside pairs_tp2_sp
SLOW = {"tp2", "pairs_pp2_interleaved"}
#: BERT pairs cover tensor parallelism; the resume test below runs ESM on two data-parallel ranks
ESM_SLOW = {"esm_tp2", "esm_dp2_recompute"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in LAYOUTS]
)
def test_bert_layout_equals_single_process(name, references, tmp_path):
    shared, layout = LAYOUTS[name]
    if (
        name.endswith("_sp")
        and TorchVersion(torch.__version__) < MIN_TORCH[("bert", "sequence_parallel")][0]
    ):
        pytest.skip(f"BERT under sequence parallelism needs a newer torch than {torch.__version__}")
    reference = references(shared)
    ranks = run_gloo(W.rank_main, 2, str(tmp_path), [*shared, *layout])
    assert_same_numbers(ranks, reference)
    if W.PAIRS[0] in shared:
        assert "sop loss" in reference["logged"]


def assert_same_numbers(ranks: list[dict], reference: dict) -> None:
    for out in ranks:  # every rank reports the global numbers
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)
        assert set(out["logged"]) == set(reference["logged"])
        for key, value in reference["logged"].items():
            assert out["logged"][key] == pytest.approx(value, abs=1e-5), key


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ESM_SLOW else n for n in ESM_LAYOUTS]
)
def test_esm_layout_equals_single_process(name, esm_overrides, references, tmp_path):
    reference = references(esm_overrides)
    assert {"lm loss", "mlm accuracy", "mlm ppl"} <= set(reference["logged"])
    ranks = run_gloo(W.rank_main, 2, str(tmp_path), [*esm_overrides, *ESM_LAYOUTS[name]])
    assert_same_numbers(ranks, reference)


def test_esm_resume_on_two_data_parallel_ranks_continues_the_global_order(
    esm_overrides, references, tmp_path
):
    """One process saves at step 2; two data-parallel ranks resume it: steps 3-4 as uninterrupted."""
    reference = references(esm_overrides)
    saving = [*esm_overrides, "--checkpoint.save_interval=2"]
    first = W.single(str(tmp_path / "one"), saving)
    assert first["losses"] == reference["losses"]  # saving changes nothing
    step2 = tmp_path / "one" / "checkpoints" / "step_0000002"
    assert step2.is_dir()
    resumed = [*esm_overrides, *DP2, f"--checkpoint.resume={step2}"]
    ranks = run_gloo(W.rank_main, 2, str(tmp_path / "two"), resumed)
    for out in ranks:
        assert out["losses"] == pytest.approx(reference["losses"][2:], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)


def test_unsupported_layouts_are_refused(tmp_path):
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout
    from epochal.train.config import model_config_from_section

    cfg = W.config(
        str(tmp_path),
        ["--model.type=esm", "--model.position_embedding_type=rope", "--model.num_tokentypes=0"],
    )
    model = model_config_from_section(cfg.model, vocab_size=W.VOCAB, seq_length=W.SEQ)
    dims = ParallelDims.from_config(cfg.parallel, 2)
    cfg = W.config(str(tmp_path), ["--parallel.tensor_parallel=2"])
    dims = ParallelDims.from_config(cfg.parallel, 2)
    check_model_layout(model, dims)  # TP without SP: fine
    with pytest.raises(ConfigError, match="parallel.sequence_parallel.*token_dropout"):
        check_model_layout(model, dims, sequence_parallel=True)
    # canonical units run ESM-2's embedding stage whole on every rank
    check_model_layout(model, dims, sequence_parallel=True, canonical=True)


def test_bert_sequence_parallelism_on_an_old_torch_is_refused_by_name(monkeypatch, tmp_path):
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout
    from epochal.train.config import model_config_from_section

    cfg = W.config(str(tmp_path), ["--parallel.tensor_parallel=2"])
    model = model_config_from_section(cfg.model, vocab_size=W.VOCAB, seq_length=W.SEQ)
    dims = ParallelDims.from_config(cfg.parallel, 2)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    check_model_layout(model, dims)  # TP alone runs on it
    with pytest.raises(ConfigError, match=r"parallel.sequence_parallel.*needs torch >= 2.13"):
        check_model_layout(model, dims, sequence_parallel=True)
