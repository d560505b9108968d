"""Fine-tuning rows under data parallelism: DP2 gives one process's losses bit for bit."""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import sft_worker as W

pytestmark = pytest.mark.distributed


def test_packed_sft_dp2_equals_one_process_bit_for_bit(tmp_path):
    """Packed rows, 4 steps of 4 micro-batches (DP2: 2 a rank): every step loss and the
    validation loss (every validation row once) equal one process's exactly."""
    train = W.write_rows(tmp_path, 0, 48, "train.jsonl")
    valid = W.write_rows(tmp_path, 48, 11, "valid.jsonl")  # a partial last global batch
    extra = [
        f"--sft.train_file={train}",
        f"--sft.valid_file={valid}",
        "--sft.split=",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=8",
        "--training.train_iters=4",
        "--training.eval_interval=4",
    ]
    reference = W.single(str(tmp_path / "single"), extra)
    assert len(reference["losses"]) == 4 and reference["eval"] is not None
    ranks = run_gloo(W.rank_main, 2, str(tmp_path / "dp2"), [*extra, "--parallel.data_parallel=2"])
    for out in ranks:
        assert out["losses"] == reference["losses"]
        assert out["eval"] == reference["eval"]
