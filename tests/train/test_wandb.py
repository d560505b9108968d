"""Weights & Biases logging, offline: the values in the run's .wandb file are metrics.jsonl's."""

from __future__ import annotations

import glob
import json
import struct
import sys

import pytest

from epochal.model import ConfigError
from epochal.train.observe.metrics import read_metrics

pytest.importorskip("wandb")


def wandb_history(path: str) -> list[dict]:
    """The history rows of an offline ``run-*.wandb`` file (W&B's leveldb-style log of
    protobuf records: a 7-byte header, 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}
            rows.append({**row, "_step": record.history.step.num})
    return rows


def config(run_dir, *extra):
    from epochal.train.config import build_config

    return build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={run_dir}",
            "--training.device=cpu",  # CPU references: the same with or without a GPU
            "--data.corpus=",
            "--data.mock=true",
            "--data.seq_length=16",
            "--model.hidden_size=32",
            "--model.num_layers=2",
            "--model.num_attention_heads=4",
            "--model.ffn_hidden_size=64",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=4",
            "--training.train_iters=4",
            "--training.eval_interval=2",
            "--training.eval_iters=1",
            "--scheduler.lr_warmup_iters=1",
            "--checkpoint.save_interval=2",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            "--logging.wandb=true",
            *extra,
        ],
    )


def test_offline_wandb_run_holds_the_logged_values_and_resumes_into_the_same_run(
    tmp_path, monkeypatch
):
    from epochal.train.trainer import Trainer

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # never reach the network
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc credentials
    run = tmp_path / "run"
    Trainer(config(run, "--training.train_iters=2"), log=False).train()
    Trainer(config(run), log=False).train()  # resumes at step 2 into the same W&B run
    files = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    run_id = (run / "wandb_run_id").read_text().strip()
    assert len(files) == 2 and all(f.endswith(f"run-{run_id}.wandb") for f in files)
    logged = {}
    for f in files:
        for row in wandb_history(f):
            logged.setdefault(row["_step"], {}).update(row)
    records = read_metrics(run / "metrics.jsonl")
    for r in records:
        if r["kind"] == "train":
            assert logged[r["step"]]["train/loss"] == pytest.approx(r["loss"], rel=1e-12)
            assert logged[r["step"]]["train/lr"] == pytest.approx(r["lr"], rel=1e-12)
        if r["kind"] == "eval":
            assert logged[r["step"]]["eval/loss"] == pytest.approx(r["loss"], rel=1e-12)
    assert sorted(logged) == [1, 2, 3, 4]


def test_wandb_without_the_package_names_the_option(tmp_path, monkeypatch):
    from epochal.train.trainer import Trainer

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ConfigError) as err:
        Trainer(config(tmp_path / "run"), log=False).train()
    assert err.value.option == "logging.wandb" and "pip install" in str(err.value)
    with pytest.raises(ConfigError) as err:
        config(tmp_path / "run", "--logging.wandb_mode=sometimes")
    assert err.value.option == "logging.wandb_mode"
