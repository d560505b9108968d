"""fp16 loss scaling under data and pipeline parallelism equals one process.

The same overflow (injected on step 3) is skipped on every rank, the scale moves
the same way, and the losses agree: under pipeline parallelism the scaled loss
travels through the schedule and is unscaled for the log.
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import fp16_worker as W

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "dp2": ["--parallel.data_parallel=2"],
    "pp2": ["--parallel.pipeline_parallel=2", "--parallel.pipeline_schedule=1f1b"],
    "tp2": ["--parallel.tensor_parallel=2"],
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return W.single(str(tmp_path_factory.mktemp("fp16_single")))


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_fp16_layout_equals_single_process(name, reference, tmp_path):
    records = run_gloo(W.rank_main, 2, str(tmp_path), LAYOUTS[name])[0]
    assert [r[2] for r in reference] == [0, 0, 1, 0, 0, 0]  # the injected step is skipped
    assert [r[1:] for r in records] == [r[1:] for r in reference]  # scale, skipped, lr
    for ours, single in zip(records, reference):
        assert ours[0] == pytest.approx(single[0], rel=1e-3)
