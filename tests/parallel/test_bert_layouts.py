"""BERT under data parallelism (each sharding, recompute) gives the single-process losses.

The model is a tiny Megatron-style BERT; the data is BioNeMo's way (masked
samples with fresh masks per epoch). Layouts the encoder has no plan for yet
(tensor / pipeline parallelism) are refused with an error naming the option.
"""

from __future__ import annotations

import pytest

from epochal.model import ConfigError
from tests.dist_utils import run_gloo
from tests.parallel import bert_worker as W

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "dp2": ["--parallel.data_parallel=2"],
    "dp2_full_shard": ["--parallel.data_parallel=2", "--parallel.dp_sharding=full"],
    "dp2_recompute": [
        "--parallel.data_parallel=2",
        "--parallel.recompute_granularity=full",
        "--parallel.recompute_method=block",
        "--parallel.recompute_num_layers=2",
    ],
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return W.single(str(tmp_path_factory.mktemp("single")))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_bert_layout_equals_single_process(name, reference, tmp_path):
    ranks = run_gloo(W.rank_main, 2, str(tmp_path), LAYOUTS[name])
    for out in ranks:
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)
        for key in ("lm loss", "mlm accuracy", "mlm ppl"):
            assert out["logged"][key] == pytest.approx(reference["logged"][key], abs=1e-5)
    assert reference["losses"][-1] < reference["losses"][0]


def test_tensor_and_pipeline_layouts_are_refused(tmp_path):
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout
    from epochal.train.config import model_config_from_section

    cfg = W.config(str(tmp_path), [])
    model = model_config_from_section(cfg.model, vocab_size=W.VOCAB, seq_length=W.SEQ)
    for option in ("tensor_parallel", "pipeline_parallel"):
        cfg = W.config(str(tmp_path), [f"--parallel.{option}=2"])
        dims = ParallelDims.from_config(cfg.parallel, 2)
        with pytest.raises(ConfigError, match=f"parallel.{option}"):
            check_model_layout(model, dims)
