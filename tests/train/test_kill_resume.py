"""Kill a training process with SIGKILL mid-run, resume it: every later loss equals the uninterrupted run's."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.train.observe.metrics import read_metrics
from tests.dist_utils import kill_tree, start_process

WORKER = str(Path(__file__).with_name("resume_worker.py"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ITERS = 12


def start(run_dir: Path, *args: str, mode: tuple[str, ...] = ()) -> subprocess.Popen:
    return start_process([sys.executable, WORKER, str(run_dir), str(ITERS), *mode, *args], env=ENV)


def finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out


def losses(run_dir: Path, kind: str = "train") -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == kind:
            out.setdefault(r["segment"], {})[r["step"]] = r["loss"]
    return out


@pytest.fixture(
    scope="module",
    params=[
        "gpt",
        # DeepSeek-V3's routing: the balancing bias, moved every step, resumes with the run
        "moe",
        pytest.param("bert", marks=pytest.mark.slow),
        pytest.param("t5", marks=pytest.mark.slow),
        # ESM-2 resumes exactly in tests/parallel/test_bert_layouts.py (on two ranks, in the
        # default tier); its kill -9 here is the GPT's mechanism with BioNeMo's samples
        pytest.param("esm", marks=pytest.mark.slow),
        # the fine-tuning heads resume exactly in process in tests/train (the default tier)
        pytest.param("finetune", marks=pytest.mark.slow),
        # ~50 s of CPU over its four processes; tests/train/test_sft_training.py resumes
        # a fine-tuning run in process in the default tier
        pytest.param("sft", marks=pytest.mark.slow),
    ],
)
def runs(tmp_path_factory, request) -> dict[str, Path]:
    """Single-threaded worker processes, two at a time (one per core); bit-exactness holds regardless.

    ``bert``: a BERT on masked data with fresh masks every epoch (BioNeMo's way).
    ``t5``: a T5 on Megatron's span-corruption samples from files, with dropout.
    ``esm``: an ESM-2 on BioNeMo's samples from a FASTA file, with dropout.
    ``sft``: the tiny GPT fine-tuned on packed chat rows (token-mean loss over each
    global batch's loss tokens), with dropout.
    """
    mode = {
        "gpt": (),
        "moe": ("--moe",),
        "bert": ("--bert",),
        "t5": ("--t5",),
        "esm": ("--esm",),
        "finetune": ("--finetune",),
        "sft": ("--sft",),
    }[request.param]
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("full", "killed", "older")}
    if request.param == "finetune":  # the encoder and tables, written before the runs start
        from tests.parallel.finetune_worker import prepare

        prepare(dirs["full"].parent / "finetune", "residue_classification")
    if request.param == "sft":  # the chat rows, written before the runs start
        from tests.parallel.sft_worker import write_rows

        rows = dirs["full"].parent / "sft"
        rows.mkdir(exist_ok=True)
        write_rows(rows, 0, 40, "train.jsonl")
        write_rows(rows, 40, 10, "valid.jsonl")
    if request.param == "t5":  # one corpus next to the run directories, written before they start
        from tests.parallel.t5_worker import write_corpus

        write_corpus(str(dirs["full"].parent))
    procs: list[subprocess.Popen] = []

    def launch(run_dir: Path, *args: str, mode: tuple[str, ...] = ()) -> subprocess.Popen:
        procs.append(start(run_dir, *args, mode=mode))
        return procs[-1]

    try:
        full = launch(dirs["full"], mode=mode)
        killed = launch(dirs["killed"], "--pause-after", "8", mode=mode)
        marker = dirs["killed"] / "paused"
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert killed.poll() is None, killed.communicate()[0]
            assert time.monotonic() < deadline, "worker never reached step 8"
            time.sleep(0.05)
        os.kill(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=30)
        assert killed.returncode == -signal.SIGKILL
        ckpts = sorted(
            p.name for p in (dirs["killed"] / "checkpoints").iterdir() if p.name.startswith("step_")
        )
        assert ckpts == ["step_0000003", "step_0000006"]
        assert (dirs["killed"] / "checkpoints" / "latest").read_text().strip() == "step_0000006"
        older = dirs["killed"] / "checkpoints" / "step_0000003"
        shutil.copytree(
            older, dirs["older"] / "from_step_3"
        )  # before the resumed run prunes nothing (keep_last=10)
        finish(full)
        resumed = launch(dirs["killed"], mode=mode)  # resume="auto" picks up step 6
        from_older = launch(
            dirs["older"], f"--checkpoint.resume={dirs['older'] / 'from_step_3'}", mode=mode
        )
        finish(resumed)
        finish(from_older)
    finally:
        for proc in procs:
            kill_tree(proc)
    return dirs


def test_resumed_losses_equal_uninterrupted_exactly(runs):
    uninterrupted, killed_and_resumed = runs["full"], runs["killed"]
    full = losses(uninterrupted)
    assert list(full) == [0] and sorted(full[0]) == list(range(1, ITERS + 1))
    got = losses(killed_and_resumed)
    assert sorted(got) == [0, 1]
    assert sorted(got[0]) == list(range(1, 9))  # killed after step 8
    assert sorted(got[1]) == list(range(7, ITERS + 1))  # resumed after checkpoint 6
    for seg in (0, 1):
        for step, loss in got[seg].items():
            assert loss == full[0][step], (seg, step, loss, full[0][step])
    full_eval, got_eval = losses(uninterrupted, "eval"), losses(killed_and_resumed, "eval")
    assert got_eval[1] == {s: v for s, v in full_eval[0].items() if s > 6}
    segments = [
        r for r in read_metrics(killed_and_resumed / "metrics.jsonl") if r["kind"] == "segment"
    ]
    assert segments[1]["start_step"] == 6 and segments[1]["resumed_from"].endswith("step_0000006")


def test_resume_from_an_older_checkpoint_into_a_new_run(runs):
    full, got = losses(runs["full"])[0], losses(runs["older"])
    assert list(got) == [0] and sorted(got[0]) == list(range(4, ITERS + 1))
    assert all(got[0][s] == full[s] for s in got[0])


def test_plot_overlays_the_resumed_segment(runs):
    from epochal.train.observe.plot import plot_run

    out = plot_run(runs["killed"])
    assert out.is_file() and out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
