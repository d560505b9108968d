"""``num_items_in_batch`` as Accelerate's example passes it: DP2 computes what one process does.

Rows of different lengths, the same global batch: one process (8 rows) and two
data-parallel processes (4 rows each) count the targets, pass the gathered count as
``num_items_in_batch``, and print the same loss and gradient norm at every step
(within float rounding), as transformers' loss promises under DDP. The reference
values are also checked against transformers' own loss on the unprepared model.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import default_data_collator

from tests.accelerate import num_items_worker
from tests.accelerate.conftest import tiny_gpt2
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.distributed


def _in_process(tmp_path: Path) -> dict:
    saved = {k: v for k, v in os.environ.items() if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    for key in saved:
        del os.environ[key]
    try:
        num_items_worker.main(str(tmp_path / "one.json"))
    finally:
        os.environ.update(saved)
    return json.loads((tmp_path / "one.json").read_text())


def _launch(tmp_path: Path, processes: int) -> dict:
    out = tmp_path / f"out{processes}.json"
    cmd = [sys.executable, "-m", "epochal.cli", "launch", "--cpu", "--num_processes"]
    cmd += [str(processes), str(HERE / "num_items_worker.py"), str(out)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    env["OMP_NUM_THREADS"] = "1"
    proc = run_process(cmd, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    return json.loads(out.read_text())


def test_dp2_equals_one_process_with_num_items_in_batch(tmp_path):
    one, dp2 = _in_process(tmp_path), _launch(tmp_path, 2)
    assert one["num_items"] == dp2["num_items"]
    assert len(set(one["num_items"])) > 1  # the steps hold different numbers of targets
    for key in ("losses", "grad_norms"):
        assert len(one[key]) == len(dp2[key]) == 3
        for a, b in zip(one[key], dp2[key], strict=True):
            assert math.isclose(a, b, rel_tol=1e-5), (key, one[key], dp2[key])
    # the first step's loss is transformers' (token sum / num_items over the global batch)
    torch.manual_seed(0)
    model = tiny_gpt2()
    batch = default_data_collator(num_items_worker.ragged(24)[:8])
    reference = model(**batch, num_items_in_batch=one["num_items"][0]).loss.item()
    assert math.isclose(one["losses"][0], reference, rel_tol=1e-5)
