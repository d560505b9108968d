"""Kill a TP2 x CP2 job with SIGKILL at step 7, resume it on one process and on TP2 x DP2: the same bits.

In canonical units (``parallel.invariant_degree``, the default under
``training.layout_invariant``) a run's records do not depend on its layout. A
4-process tensor- and context-parallel job (dropout on) is killed after step 7; its
checkpoint of step 6 is resumed in one process and, in a copy, on two
tensor-parallel by two data-parallel ranks. Every record after the checkpoint
(loss, gradient norm, learning rate, sample digest, evaluation) and the weights
digest of the last checkpoint equal those of the uninterrupted TP2 x CP2 run, bit
for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from epochal.train.observe.metrics import read_metrics
from epochal.train.replay import _is_value
from tests.dist_utils import kill_tree, run_process, start_process

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORKER = str(Path(__file__).with_name("train_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ITERS = 9
# key/value heads split over TP x CP = 4; weight gradients in 2 x 2 sequence chunks on
# every layout (the TP2 x CP2 run's own default, given to the resumed runs too), each
# chunk's accumulated over the step (the default order: on TP2 x DP2, whose ranks hold
# both chunks, each chunk goes through the ordered reduction)
MODEL = ["--model.num_query_groups=4", "--parallel.invariant_context_degree=2"]
TP2_CP2 = ["--parallel.tensor_parallel=2", "--parallel.context_parallel=2"]
TP2_DP2 = ["--parallel.tensor_parallel=2", "--parallel.dp_sharding=optimizer"]


def _cmd(run_dir: Path, procs: int, layout: list[str], *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={procs}",
        WORKER,
        str(run_dir),
        str(ITERS),
        *args,
        *MODEL,
        *layout,
    ]


def _run(run_dir: Path, procs: int, layout: list[str]) -> None:
    proc = run_process(_cmd(run_dir, procs, layout), env=ENV, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def _records(run_dir: Path) -> dict[tuple[str, int], dict]:
    """The last segment's value of every (kind, step) record (times and memory left out)."""
    out: dict[tuple[str, int], dict] = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r.get("kind") in ("train", "eval") and "step" in r:
            out[(r["kind"], r["step"])] = {k: v for k, v in r.items() if _is_value(k)}
    return out


def _final_digest(run_dir: Path) -> str:
    state = run_dir / "checkpoints" / "step_0000009" / "trainer_state.json"
    return json.loads(state.read_text())["weight_digest"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tp2cp2_full")
    _run(run_dir, 4, TP2_CP2)
    return run_dir


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tp2cp2_killed")
    proc = start_process(_cmd(run_dir, 4, TP2_CP2, "--pause-after", "7"), env=ENV)
    markers = [run_dir / f"paused_rank{r}" for r in range(4)]
    deadline = time.monotonic() + 300
    try:
        while not all(m.exists() for m in markers):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the job never reached step 7"
            time.sleep(0.1)
    finally:
        kill_tree(proc)  # SIGKILL torchrun and every worker
    for marker in markers:
        marker.unlink()
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert ckpts == ["step_0000003", "step_0000006"]
    return run_dir


@pytest.mark.parametrize(
    ("name", "procs", "layout"), [("one process", 1, []), ("TP2 x DP2", 4, TP2_DP2)]
)
def test_a_killed_tp2_cp2_run_resumes_on_another_layout_bit_for_bit(
    uninterrupted, killed, tmp_path, name, procs, layout
):
    run_dir = tmp_path / "resumed"
    shutil.copytree(killed, run_dir)
    _run(run_dir, procs, layout)  # resume="auto": from the checkpoint of step 6
    full, got = _records(uninterrupted), _records(run_dir)
    later = sorted(key for key in full if key[1] > 6)
    assert [key for key in later if key[0] == "train"] == [("train", s) for s in (7, 8, 9)]
    assert ("eval", 8) in later
    for key in later:
        assert got[key] == full[key], (name, key)
    assert _final_digest(run_dir) == _final_digest(uninterrupted)
