"""``epochal replay``: a step of a tensor-parallel run re-trained on one process gives every record's bits.

The run trains 4 steps of a tiny GPT with dropout under TP2 with sequence
parallelism (two processes, layout-invariant), checkpoints every 2 steps; the
replay of step 4 on one process resumes from step 2 and compares the metrics of
steps 3-4, the evaluation of step 4 and the weight digest of checkpoint 4.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.dist_utils import run_process

pytestmark = pytest.mark.distributed

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SHAPE = [
    "--preset",
    "tiny",
    "--training.train_iters=4",
    "--checkpoint.save_interval=2",
    "--model.num_layers=2",
    "--model.hidden_size=64",
    "--model.ffn_hidden_size=128",
    "--model.num_attention_heads=4",
    "--model.hidden_dropout=0.1",
    "--model.attention_dropout=0.1",
    "--data.seq_length=32",
    "--training.global_batch_size=4",
    "--training.micro_batch_size=2",
    "--training.device=cpu",
    "--training.layout_invariant=true",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def epochal(*args: str, timeout: float = 300):
    return run_process([sys.executable, "-m", "epochal.cli", *args], env=ENV, timeout=timeout)


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("replay") / "tp2"
    proc = epochal(
        "train",
        *SHAPE,
        f"--run_dir={run_dir}",
        "--parallel.tensor_parallel=2",
        "--parallel.sequence_parallel=true",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir


def test_a_tp2_step_replayed_on_one_process_is_identical(tp2_run):
    proc = epochal("replay", str(tp2_run), "--step", "4", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["identical"] and out["from_checkpoint_step"] == 2
    compared = {c["what"]: c for c in out["comparisons"]}
    for what in (
        "step 3 train loss",
        "step 3 train grad_norm",
        "step 4 train loss",
        "step 4 train grad_norm",
        "step 4 eval loss",
        "weights after step 4",
    ):
        assert compared[what]["equal"], compared[what]
    weights = compared["weights after step 4"]
    recorded = json.loads((tp2_run / "checkpoints/step_0000004/trainer_state.json").read_text())
    assert weights["run"] == recorded["weight_digest"] and len(weights["run"]) == 16


def test_a_changed_record_is_named(tp2_run, tmp_path):
    altered = tmp_path / "altered"
    shutil.copytree(tp2_run, altered)
    lines = (altered / "metrics.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("kind") == "train" and rec["step"] == 3:
            rec["grad_norm"] = rec["grad_norm"] * (1 + 2**-20)  # a few bits off
            lines[i] = json.dumps(rec)
    text = "\n".join(lines) + "\n"
    (altered / "metrics.jsonl").write_text(text.replace(str(tp2_run), str(altered)))
    proc = epochal("replay", str(altered), "--step", "4")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step 3 train grad_norm" in proc.stdout and "DIFFERS" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "differs: step 3 train grad_norm"


def test_a_step_the_run_never_trained_is_refused(tp2_run):
    proc = epochal("replay", str(tp2_run), "--step", "9")
    assert proc.returncode == 2
    assert f"{tp2_run} has no record of step 9" in proc.stderr
    assert "records steps 1-4" in proc.stderr


def test_generation_refuses_an_invariance_degree_that_is_not_a_power_of_two(tp2_run):
    proc = epochal("generate", "--checkpoint", str(tp2_run), "--prompt-ids", "5,17",
                   "--invariant-degree", "3", "--device", "cpu")  # fmt: skip
    assert proc.returncode == 2 and "power of two" in proc.stderr


@pytest.mark.slow  # the same bits in process: tests/model/test_generation_tp.py
def test_generation_in_canonical_units_gives_the_same_tokens_on_tp2_and_one_process(
    tp2_run, tmp_path
):
    outputs = []
    for tp in (1, 2):
        out = tmp_path / f"tp{tp}.jsonl"
        proc = epochal(
            "generate",
            "--checkpoint",
            str(tp2_run),
            "--prompt-ids",
            "5,17,3,9",
            "--max-new-tokens",
            "6",
            "--device",
            "cpu",
            "--invariant-degree",
            "8",
            "--tensor-parallel",
            str(tp),
            "--output",
            str(out),
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outputs.append([json.loads(line)["tokens"] for line in out.read_text().splitlines()])
    assert outputs[0] == outputs[1] and len(outputs[0][0]) >= 6
