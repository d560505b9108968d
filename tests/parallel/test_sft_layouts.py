"""Fine-tuning rows under data and context parallelism: one process's losses bit for bit."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import sft_worker as W

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def packed_rows(tmp_path_factory):
    """Packed rows, 4 steps of 4 micro-batches, and one process's losses over them."""
    root = tmp_path_factory.mktemp("sft")
    train = W.write_rows(root, 0, 48, "train.jsonl")
    valid = W.write_rows(root, 48, 11, "valid.jsonl")  # a partial last global batch
    extra = [
        f"--sft.train_file={train}",
        f"--sft.valid_file={valid}",
        "--sft.split=",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=8",
        "--training.train_iters=4",
        "--training.eval_interval=4",
    ]
    reference = W.single(str(root / "single"), extra)
    assert len(reference["losses"]) == 4 and reference["eval"] is not None
    return root, extra, reference


@pytest.mark.parametrize(
    "layout",
    [
        "--parallel.data_parallel=2",  # 2 micro-batches a rank
        # each packed row (several conversations, a document mask) cut into 4 chunks
        "--parallel.context_parallel=2",
    ],
)
def test_packed_sft_layout_equals_one_process_bit_for_bit(packed_rows, layout):
    """Every step loss equals one process's exactly (the preset trains in canonical units),
    and the validation loss (every validation row once) too under DP2; under CP2 the
    validation table's partial last global batch (filler rows) gives a validation loss
    within float rounding (a table of whole global batches gives the same bits)."""
    root, extra, reference = packed_rows
    run_dir = str(root / layout.split(".")[-1].replace("=", ""))
    for out in run_gloo(W.rank_main, 2, run_dir, [*extra, layout]):
        assert out["losses"] == reference["losses"]
        if "data_parallel" in layout:
            assert out["eval"] == reference["eval"]
        else:
            assert out["eval"] == pytest.approx(reference["eval"], rel=1e-6)
