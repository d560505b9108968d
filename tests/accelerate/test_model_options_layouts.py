"""Frozen weights, ``num_items_in_batch`` and a written learning rate: DP2, TP2 and PP2 equal one process.

``num_items_in_batch`` counts the targets of the global batch, so the loss and the
gradient are the same whatever the layout (data-parallel ranks each hold part of
the rows); frozen weights stay bit for bit under every layout.
"""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests.accelerate import model_options_worker
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_layouts_agree_with_one_process(tmp_path):
    saved = {k: v for k, v in os.environ.items() if k.startswith("MEGATRON_LM_")}
    for key in saved:
        del os.environ[key]
    try:
        expected = model_options_worker.run(2)
    finally:
        os.environ.update(saved)
    assert expected["frozen_kept"]
    cmd = [
        sys.executable,
        "-m",
        "epochal.cli",
        "launch",
        "--cpu",
        "--num_processes",
        "2",
        str(HERE / "model_options_worker.py"),
        str(tmp_path / "out.json"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = run_process(cmd, timeout=600, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    results = json.loads((tmp_path / "out.json").read_text())
    for name, got in results.items():
        assert got["frozen_kept"], name
        for key in ("losses", "grad_norms"):
            assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(got[key], expected[key])), (
                name,
                key,
                got[key],
                expected[key],
            )
        assert math.isclose(got["head_sum"], expected["head_sum"], abs_tol=1e-4), name
