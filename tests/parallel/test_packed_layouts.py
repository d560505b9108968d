"""data.pack_sequences under TP2, TP2 + sequence parallelism and DP2: the padded single-process losses.

Samples have different lengths (``bert_worker.VariableLengths``); the reference is the
single-process run on the *padded* micro-batches, so these tests check packing and the
layout at once.
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import bert_worker as W

pytestmark = pytest.mark.distributed

PACK = ["--data.pack_sequences=true"]
TP2 = ["--parallel.tensor_parallel=2"]
# name -> (model overrides shared with the reference, layout overrides)
LAYOUTS = {
    "esm_tp2": (W.ESM, TP2),
    "esm_dp2": (W.ESM, ["--parallel.data_parallel=2"]),
    "pairs_tp2_sp": (W.PAIRS, [*TP2, "--parallel.sequence_parallel=true"]),
    "pairs_dp2": (W.PAIRS, ["--parallel.data_parallel=2"]),
}


# packing under TP2 is checked with ESM-2; the BERT pairs add sequence parallelism
SLOW = {"pairs_tp2_sp", "pairs_dp2"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in LAYOUTS]
)
def test_packed_layout_equals_padded_single_process(name, tmp_path):
    shared, layout = LAYOUTS[name]
    reference = W.single(str(tmp_path / "single"), shared, variable=True)
    ranks = run_gloo(W.rank_main, 2, str(tmp_path / "run"), [*shared, *PACK, *layout], True)
    for out in ranks:
        assert out["losses"] == pytest.approx(reference["losses"], abs=1e-5)
        assert out["eval"] == pytest.approx(reference["eval"], abs=1e-5)
        for key, value in reference["logged"].items():
            assert out["logged"][key] == pytest.approx(value, abs=1e-5), key
