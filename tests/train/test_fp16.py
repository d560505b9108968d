"""fp16 mixed precision with Megatron's loss scaling: the scaler, skipped steps, exact resume, errors.

The scaler is checked decision for decision against Megatron-Core's own
``DynamicGradScaler``; the layouts (DP2, PP2) are in ``tests/parallel/test_fp16_layouts.py``.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from epochal.model import ConfigError
from epochal.train.inputs.loaders import make_loaders
from epochal.train.observe.metrics import read_metrics
from epochal.train.optim.loss_scaler import DynamicLossScaler, check_fp16_support
from epochal.train.trainer import Trainer
from tests.train.fp16_steps import IndexedCounting
from tests.train.test_trainer import config as trainer_config

VOCAB = 64
STEP = "--training.train_step=tests.train.fp16_steps:OverflowAtSteps"


def config(run_dir, *extra):
    """``tests/train/test_trainer.py``'s tiny GPT, in fp16, without evaluations or saves."""
    return trainer_config(
        run_dir,
        "--training.global_batch_size=4",
        "--training.train_iters=8",
        "--training.eval_interval=0",
        "--training.eval_iters=0",
        "--training.device=cpu",
        "--training.fp16=true",
        "--scheduler.lr_warmup_iters=2",
        "--checkpoint.save_interval=0",
        *extra,
    )


def trainer(run_dir, *extra):
    cfg = config(run_dir, *extra)
    data = make_loaders(cfg, IndexedCounting(1000, 8, VOCAB), None, vocab_size=VOCAB)
    return Trainer(cfg, data=data, log=False)


def train_records(run_dir):
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def test_dynamic_scaler_matches_megatron_core(monkeypatch):
    grad_scaler = pytest.importorskip("megatron.core.optimizer.grad_scaler")
    real_tensor = torch.tensor

    def on_cpu(*args, **kwargs):  # Megatron-Core puts the scale on "cuda"
        kwargs.pop("device", None)
        return real_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", on_cpu)
    for hysteresis, window, initial, floor in [
        (2, 3, 2.0**16, 1.0),
        (1, 1, 8.0, 2.0),
        (3, 5, 2.0**32, 1.0),
    ]:
        theirs = grad_scaler.DynamicGradScaler(
            initial_scale=initial,
            min_scale=floor,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=window,
            hysteresis=hysteresis,
        )
        ours = DynamicLossScaler(initial, floor, 2.0, 0.5, window, hysteresis)
        rng = random.Random(hysteresis * 100 + window)
        for _ in range(300):
            found_inf = rng.random() < 0.4
            theirs.update(found_inf)
            ours.update(found_inf)
            assert ours.scale == float(theirs.scale.item())
            state = theirs.state_dict()
            assert ours.growth_tracker == state["growth_tracker"]
            assert ours.hysteresis_tracker == state["hysteresis_tracker"]


def test_an_injected_overflow_skips_the_step_and_lowers_the_scale(tmp_path):
    tr = trainer(
        tmp_path,
        STEP,
        "--training.train_step_kwargs={steps = [3, 5, 6]}",
        "--training.initial_loss_scale=1024",
        "--training.hysteresis=2",
        "--training.loss_scale_window=3",
    )
    params = []
    tr.add_callback(
        lambda t, step, rec: params.append(
            torch.cat([p.detach().flatten().clone() for p in t.model_parts[0].parameters()])
        )
    )
    tr.train()
    recs = train_records(tmp_path)
    assert [r["skipped"] for r in recs] == [0, 0, 1, 0, 1, 1, 0, 0]
    # Megatron's hysteresis: the first overflow (step 3) keeps the scale; a clean step
    # does not refill the tracker (only growth does), so steps 5 and 6 each halve it;
    # 2 clean steps are fewer than the window of 3: no growth.
    assert [r["loss_scale"] for r in recs] == [1024, 1024, 1024, 1024, 512, 256, 256, 256]
    for i, r in enumerate(recs[1:], start=1):
        if r["skipped"]:  # no optimizer step: the weights and the learning rate stay
            assert torch.equal(params[i], params[i - 1])
            assert recs[i + 1]["lr"] == r["lr"]
            assert r["loss"] == float("inf")  # the injected loss, logged as it was
        else:
            assert not torch.equal(params[i], params[i - 1])
            assert math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])


def test_the_default_scale_overflows_first_then_trains(tmp_path):
    """Megatron's 2**32 first scale overflows fp16 gradients: steps are skipped until it fits."""
    tr = trainer(tmp_path, "--training.hysteresis=1", "--training.train_iters=30")
    tr.train()
    recs = train_records(tmp_path)
    skipped = [r["skipped"] for r in recs]
    first_ok = skipped.index(0)
    assert first_ok >= 1 and all(skipped[:first_ok])  # overflowed from the start
    scales = [r["loss_scale"] for r in recs]
    assert scales[:first_ok] == [2.0 ** (32 - k) for k in range(1, first_ok + 1)]
    assert recs[-1]["loss"] < recs[first_ok]["loss"]  # it trains once the scale fits


def test_fp16_resume_is_exact_including_the_scale(tmp_path):
    extra = (
        STEP,
        "--training.train_step_kwargs={steps = [2, 3, 6]}",
        "--training.initial_loss_scale=4096",
        "--training.hysteresis=1",
        "--training.loss_scale_window=2",
    )
    trainer(tmp_path / "full", *extra).train()
    trainer(
        tmp_path / "half", *extra, "--training.train_iters=4", "--checkpoint.save_final=true"
    ).train()
    resumed = trainer(tmp_path / "half", *extra)
    resumed.train()
    a, b = train_records(tmp_path / "full"), train_records(tmp_path / "half")
    keys = ("step", "loss", "loss_scale", "skipped", "lr", "grad_norm")
    assert [[r[k] for k in keys] for r in b] == [[r[k] for k in keys] for r in a]
    assert [r["skipped"] for r in a] == [0, 1, 1, 0, 0, 1, 0, 0]
    # halved at 2 and 3, doubled after 4-5, halved at 6 (checkpoint after 4: mid-window)
    assert [r["loss_scale"] for r in a] == [4096, 2048, 1024, 1024, 2048, 1024, 1024, 2048]


def test_fp16_on_a_device_without_float16_autocast_is_refused(tmp_path, monkeypatch):
    def no_fp16(device_type, dtype=None, **kwargs):
        raise RuntimeError(f"{device_type} autocast does not support {dtype}")

    monkeypatch.setattr(torch, "autocast", no_fp16)
    with pytest.raises(ConfigError, match="training.fp16.*no float16 autocast"):
        check_fp16_support(torch.device("cpu"))
    with pytest.raises(ConfigError, match="training.fp16"):
        trainer(tmp_path)


@pytest.mark.parametrize(
    "extra, option",
    [
        ("--training.bf16=true", "training.fp16"),
        ("--training.loss_scale=0", "training.loss_scale"),
        ("--training.min_loss_scale=0", "training.min_loss_scale"),
        ("--training.initial_loss_scale=0.5", "training.initial_loss_scale"),
        ("--training.hysteresis=0", "training.hysteresis"),
        ("--training.loss_scale_window=0", "training.loss_scale_window"),
    ],
)
def test_bad_fp16_options_are_named(tmp_path, extra, option):
    with pytest.raises(ConfigError, match=option):
        config(tmp_path, extra)


def test_a_constant_loss_scale_never_changes_but_still_skips(tmp_path):
    tr = trainer(
        tmp_path,
        STEP,
        "--training.train_step_kwargs={steps = [2]}",
        "--training.loss_scale=128",
        "--training.train_iters=3",
    )
    tr.train()
    recs = train_records(tmp_path)
    assert [r["skipped"] for r in recs] == [0, 1, 0]
    assert [r["loss_scale"] for r in recs] == [128, 128, 128]
