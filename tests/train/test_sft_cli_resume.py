"""An SFT run started with ``epochal train --preset sft-tiny`` and killed with SIGKILL resumes
with the same command, bit for bit; a resume with another ``[sft]`` option is refused.

The runs are ``python -m epochal.cli train`` processes (the command line, not the
library), all with the same arguments: an uninterrupted run and one that is killed
at its evaluation of step 6 (after its checkpoint of step 3; ``tests/train/sft_pause.py``
holds it there) run side by side (one thread each), then the killed one is started
again with the very same command. Every record of its ``metrics.jsonl`` (losses, gradient norms, learning
rates, sample digests, validation) and its final weights must equal the
uninterrupted run's exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import kill_tree, start_process

ROOT = Path(__file__).resolve().parents[2]  # tests.train.sft_pause is imported from here
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p),
}
ITERS = 12
#: the preset shrunk to a 2-layer, 64-wide model, with dropout (the RNG state resumes too)
ARGS = [
    "--preset",
    "sft-tiny",
    "--training.device=cpu",
    f"--training.train_iters={ITERS}",
    "--training.eval_interval=3",
    "--checkpoint.save_interval=3",
    "--checkpoint.keep_last=10",
    "--model.num_layers=2",
    "--model.hidden_size=64",
    "--model.ffn_hidden_size=128",
    "--model.hidden_dropout=0.1",
    "--model.attention_dropout=0.1",
    "--logging.progress=false",
    "--logging.tensorboard=false",
    "--training.eval_callback=tests.train.sft_pause:pause_after_checkpoint",
]
#: what may differ between two runs of the same records: wall-clock measurements
TIMING = {"time", "tokens_per_s", "tflops", "step_time_s", "mem_peak_rss_gib", "mem_peak_rss_pct"}


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "epochal.cli", "train", *ARGS, f"--run_dir={run_dir}"]


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("sft_cli")
    full_dir, killed_dir = root / "full", root / "killed"
    marker = Path(f"{killed_dir}.paused")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(start_process(command(full_dir), env=ENV))
        killed = start_process(
            command(killed_dir), env={**ENV, "SFT_PAUSE_RUN_DIR": str(killed_dir)}
        )
        procs.append(killed)
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert killed.poll() is None, killed.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the run never reached its evaluation of step 6"
            time.sleep(0.02)
        kill_tree(killed)  # SIGKILL in the evaluation of step 6
        assert killed.returncode == -signal.SIGKILL
        assert (killed_dir / "checkpoints" / "latest").read_text().strip() == "step_0000003"
        procs.append(start_process(command(killed_dir), env=ENV))  # the same command again
        finish(procs[0])
        resumed_out = finish(procs[-1])
    finally:
        for proc in procs:
            kill_tree(proc)
    return {"full": full_dir, "killed": killed_dir, "out": resumed_out, "root": root}


def records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] in ("train", "eval")]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and k != "segment"}


def test_a_killed_sft_run_resumes_bit_identically_with_its_own_command(runs):
    full = {(r["kind"], r["step"]): without_timing(r) for r in records(runs["full"])}
    assert sorted(s for k, s in full if k == "train") == list(range(1, ITERS + 1))
    assert sorted(s for k, s in full if k == "eval") == [3, 6, 9, 12]
    got = records(runs["killed"])
    segments = [r for r in read_metrics(runs["killed"] / "metrics.jsonl") if r["kind"] == "segment"]
    assert [s["segment"] for s in segments] == [0, 1]
    start = segments[1]["start_step"]
    assert start == 3 and segments[1]["resumed_from"].endswith("step_0000003")
    killed = [r for r in got if r["segment"] == 0]
    assert sorted(r["step"] for r in killed if r["kind"] == "train") == list(range(1, 7))
    assert f"resumed from step {start}" in runs["out"]
    resumed = [r for r in got if r["segment"] == 1]
    assert sorted(r["step"] for r in resumed if r["kind"] == "train") == list(
        range(start + 1, ITERS + 1)
    )
    for record in got:  # losses, grad norms, learning rates, sample digests, validation
        want = full[(record["kind"], record["step"])]
        assert without_timing(record) == want, (record["segment"], record["kind"], record["step"])
    assert {"loss", "grad_norm", "lr", "sample_digest"} <= set(full[("train", ITERS)])
    assert "loss" in full[("eval", ITERS)]
    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint

    final = f"checkpoints/step_{ITERS:07d}"
    a = load_epochal_checkpoint(runs["full"] / final).state
    b = load_epochal_checkpoint(runs["killed"] / final).state
    assert sorted(a) == sorted(b) and len(a) > 10
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.fixture(scope="module")
def elsewhere(runs) -> dict[str, Path]:
    """The preset's rows and tokenizer copied to other paths (the same content)."""
    root = runs["root"]
    rows = root / "rows.jsonl"
    shutil.copy(CHAT_FILE, rows)
    tokenizer = root / "tokenizer"
    if not tokenizer.exists():
        shutil.copytree(TOKENIZER_DIR, tokenizer)
    return {"rows": rows, "tokenizer": tokenizer}


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ("--sft.train_file={rows}", "sft.train_file"),
        ("--sft.valid_file={rows}", "sft.valid_file"),
        ("--sft.split=80,20", "sft.split"),
        ("--sft.loss_on=all", "sft.loss_on"),
        ("--sft.packing=false", "sft.packing"),
        ("--sft.overlength=skip", "sft.overlength"),
        ("--sft.tokenizer={tokenizer}", "sft.tokenizer"),
    ],
)
def test_a_resume_with_another_sft_option_is_refused_before_data(
    runs, elsewhere, capsys, change, option
):
    run = runs["killed"]
    before = (run / "metrics.jsonl").read_bytes(), (run / "config.toml").read_bytes()
    capsys.readouterr()
    args = ["train", *ARGS, f"--run_dir={run}", change.format(**elsewhere)]
    assert cli_main(args) == 2
    out = capsys.readouterr()
    error = out.err.splitlines()[-1]
    assert error.startswith("epochal train: error: run_dir: ") and "holds another run" in error
    assert f"{option}: " in error
    assert "sft train:" not in out.out  # refused before the rows were read
    assert ((run / "metrics.jsonl").read_bytes(), (run / "config.toml").read_bytes()) == before


def test_the_next_hint_of_a_chat_run_asks_a_question_with_chat(runs, tmp_path):
    """The run's ``next:`` lines suggest ``--chat`` with its first user message; rows of plain
    prompt-completion strings (trained without the chat template) keep a plain prompt."""
    from epochal.train.config import build_config
    from epochal.train.next_steps import next_commands

    run = runs["killed"]
    chat = f"epochal generate --checkpoint {run} --chat --prompt 'What is the opposite of light?'"
    assert f"  {chat} --max-new-tokens 40" in runs["out"].splitlines()
    rows = tmp_path / "pc.jsonl"
    rows.write_text(json.dumps({"prompt": "Two plus two is", "completion": " four."}) + "\n")
    cfg = build_config(preset="sft-tiny", overrides=[f"--sft.train_file={rows}", "--sft.split="])
    line = next_commands(cfg, "runs/pc", final_step=1)[0]
    assert line.startswith("epochal generate --checkpoint runs/pc --prompt The ")
