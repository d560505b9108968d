"""Reusing a run directory (issue 15, item 4): a resume with a configuration that defines
another run is refused naming the options; a fresh start in a directory with an earlier
history moves that history aside (nothing deleted) and is not labelled "resumed"."""

from __future__ import annotations

import json

import pytest

from epochal.cli import main as cli_main
from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.observe.metrics import read_metrics
from epochal.train.state.run_dir import RUN_DEFINING, check_resume_config, config_changes

TINY = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.mock=true",
    "--data.seq_length=16",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--model.vocab_size=128",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.train_iters=2",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def train(run, *extra):
    return cli_main(["train", f"--run_dir={run}", *TINY, *extra])


def segments(run):
    return [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "segment"]


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ("--data.seq_length=8", "data.seq_length"),
        ("--training.seed=7", "training.seed"),
        ("--training.global_batch_size=8", "training.global_batch_size"),
        ("--training.micro_batch_size=1", "training.micro_batch_size"),
        ("--data.split=50,50,0", "data.split"),
    ],
)
def test_resume_with_another_run_definition_is_refused(tmp_path, capsys, change, option):
    run = tmp_path / "run"
    assert train(run) == 0
    before = (run / "metrics.jsonl").read_bytes(), (run / "config.toml").read_bytes()
    capsys.readouterr()
    assert train(run, "--training.train_iters=4", change) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the note of the preset's values
    # refused before any data is prepared (the preflight), with the way out
    assert err.startswith("epochal train: error: run_dir: ") and f"{option}: " in err
    assert "holds another run" in err and "--run_dir=" in err
    assert "training.train_iters" not in err  # an allowed change is not listed as a conflict
    # nothing was touched: no new segment, config.toml still the run's own
    assert ((run / "metrics.jsonl").read_bytes(), (run / "config.toml").read_bytes()) == before


def test_allowed_changes_resume_and_are_reported(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(run) == 0
    capsys.readouterr()
    assert train(run, "--training.train_iters=3", "--optimizer.lr=1e-3") == 0
    out = capsys.readouterr().out
    assert "resuming with changed options: " in out and "training.train_iters: 2 -> 3" in out
    assert "optimizer.lr" in out and "trained steps 3-3 (resumed from step 2)" in out
    assert [s["segment"] for s in segments(run)] == [0, 1]


def test_fresh_start_moves_the_earlier_history_aside(tmp_path, capsys):
    run = tmp_path / "run"
    # an earlier run that never saved a checkpoint (e.g. stopped before the first one)
    assert train(run, "--checkpoint.save_interval=0", "--checkpoint.save_final=false") == 0
    old = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train(run) == 0  # nothing to resume, the same configuration: it starts over
    out = capsys.readouterr().out
    assert "has metrics from an earlier run but no checkpoint" in out
    archived = sorted(run.glob("metrics.*.jsonl"))
    assert len(archived) == 1 and archived[0].read_text() == old  # moved, not deleted
    assert len(list(run.glob("config.*.toml"))) == 1
    segs = segments(run)
    assert [(s["segment"], s["start_step"], s["resumed_from"]) for s in segs] == [(0, 0, None)]
    # a second archive in the same second does not overwrite the first
    (run / "checkpoints").rename(tmp_path / "elsewhere")
    assert train(run) == 0
    assert len(list(run.glob("metrics.*.jsonl"))) == 2


def test_a_record_without_checkpoint_identifies_the_run(tmp_path, capsys):
    """A directory with another run's config.toml and metrics.jsonl but no checkpoint yet
    is not taken over by a different configuration: refused, naming the options and path."""
    run = tmp_path / "run"
    assert train(run, "--checkpoint.save_interval=0", "--checkpoint.save_final=false") == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert train(run, "--training.seed=5", "--model.num_layers=1") == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the note of the preset's values
    assert err.startswith("epochal train: error: run_dir: ") and str(run / "config.toml") in err
    assert "training.seed: 1234 -> 5" in err and "model.num_layers: 2 -> 1" in err
    assert "--run_dir=NEW_DIR" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_config_changes_classifies_options(tmp_path):
    a = build_config(preset="tiny", overrides=[f"--run_dir={tmp_path}"])
    b = build_config(
        preset="tiny",
        overrides=[
            "--run_dir=elsewhere",
            "--data.num_workers=2",
            "--parallel.tensor_parallel=2",
            "--data.split=90,10,0",
            "--model.num_layers=2",
        ],
    )
    defining, other = config_changes(a, b)
    assert [line.split(":")[0] for line in defining] == ["data.split"]
    # the model is compared resolved, by the trainer (tests/train/test_init_from.py)
    assert {line.split(":")[0] for line in other} == {
        "data.num_workers",
        "parallel.tensor_parallel",
        "model.num_layers",
    }
    assert "model" not in RUN_DEFINING
    folder = tmp_path / "step"
    folder.mkdir()
    assert check_resume_config(folder, b) == []  # no config.toml (a converted model): no check
    (folder / "trainer_state.json").write_text('{"format": 1, "step": 1}')
    (folder / "config.toml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="config.toml"):
        check_resume_config(folder, b)
    assert json.dumps(other)  # plain strings, printable
