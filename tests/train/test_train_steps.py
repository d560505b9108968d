"""Train steps: Megatron's forward_step / loss_func contract, the registry, custom steps, errors."""

from __future__ import annotations

import copy
import tomllib
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from epochal.model import ConfigError
from epochal.train import GPTTrainStep, TrainStep, avg_losses_across_data_parallel_group
from epochal.train.observe.metrics import read_metrics
from epochal.train.steps import BertTrainStep, load_train_step, train_step_class
from tests.train.synthetic import CountingDataset
from tests.train.test_trainer import VOCAB, trainer

CUSTOM = "tests.train.accelerate_custom_loss:GPTTrainStepWithCustomLoss"
KEYS = [3, 17, 40]
ALPHA = 0.25


def _custom(tmp_path, *extra):
    return trainer(
        tmp_path,
        f"--training.train_step={CUSTOM}",
        f"--training.train_step_kwargs={{keytoken_ids = {KEYS}, alpha = {ALPHA}}}",
        *extra,
        train=CountingDataset(1000, 8, VOCAB),
    )


def test_registry_picks_the_step_of_the_model_type():
    assert train_step_class("gpt") is GPTTrainStep
    assert train_step_class("bert") is BertTrainStep and train_step_class("esm") is BertTrainStep
    with pytest.raises(ConfigError, match="model.type"):
        train_step_class("llama-moe")


def test_default_step_logs_lm_loss_by_name(tmp_path):
    tr = trainer(tmp_path)
    assert type(tr.train_step_handler) is GPTTrainStep
    tr.train()
    trains = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    # the mean of the micro-batch means is the step loss
    assert [r["lm loss"] for r in trains] == pytest.approx([r["loss"] for r in trains], rel=1e-6)


def test_accelerate_custom_loss_example_trains(tmp_path):
    """Accelerate's GPTTrainStepWithCustomLoss (imports changed only) from the configuration."""
    tr = _custom(tmp_path)
    assert type(tr.train_step_handler).__name__ == "GPTTrainStepWithCustomLoss"
    reference = copy.deepcopy(tr.model_parts[0])
    ds = CountingDataset(1000, 8, VOCAB)
    out = tr.train_step(tr.data.train_loader.stream())
    per_mb = []
    for mb in range(3):  # gbs 6 = 3 micro-batches of 2
        items = [ds[2 * mb + j] for j in range(2)]
        tokens = torch.stack([x["tokens"] for x in items])
        labels = torch.stack([x["labels"] for x in items])
        ce = F.cross_entropy(reference(tokens).flatten(0, 1), labels.flatten(), reduction="none")
        per_sample = ce.view(2, 8).mean(dim=1)
        weights = 1.0 + ALPHA * sum((tokens == k).float().sum(dim=1) for k in KEYS)
        per_mb.append((per_sample * weights).mean())
    expected = torch.stack(per_mb).mean()
    assert out["loss"] == pytest.approx(expected.item(), rel=1e-6)
    assert out["lm loss"] == pytest.approx(expected.item(), rel=1e-6)
    plain = trainer(tmp_path / "plain", train=CountingDataset(1000, 8, VOCAB))
    assert plain.train_step(plain.data.train_loader.stream())["loss"] != pytest.approx(out["loss"])


def test_subclass_overriding_methods(tmp_path):
    class Halved(GPTTrainStep):
        def loss_func(self, loss_mask, output_tensor):
            loss, logged = super().loss_func(loss_mask, output_tensor)
            return loss / 2, {**logged, "half": loss.detach() / 2}

    a, b = trainer(tmp_path / "a"), trainer(tmp_path / "b")
    b.train_step_handler = Halved(b.config)
    out_a = a.train_step(a.data.train_loader.stream())
    out_b = b.train_step(b.data.train_loader.stream())
    assert out_b["loss"] == pytest.approx(out_a["loss"] / 2, rel=1e-6)
    assert out_b["half"] == pytest.approx(out_b["loss"], rel=1e-6)
    assert out_b["grad_norm"] == pytest.approx(out_a["grad_norm"] / 2, rel=1e-4)


def test_evaluation_uses_the_step(tmp_path):
    tr = trainer(tmp_path)
    plain = tr.evaluate()
    assert tr.last_eval_logged["lm loss"] == pytest.approx(plain, rel=1e-6)
    tr.train_step_handler = load_train_step(CUSTOM)(tr.config, keytoken_ids=KEYS, alpha=1.0)
    assert tr.evaluate() > plain  # every weight >= 1


def test_avg_losses_without_data_parallelism_is_the_values():
    out = avg_losses_across_data_parallel_group([torch.tensor(1.5), torch.tensor([2.0])])
    assert out.tolist() == [1.5, 2.0]


class NoDict(GPTTrainStep):
    def loss_func(self, loss_mask, output_tensor):
        return (output_tensor * loss_mask).mean()


class Incomplete(TrainStep):
    def get_batch(self, data_iterator):
        return next(data_iterator)


def test_errors(tmp_path):
    for spec, match in [
        ("no_colon_here", "package.module:Class"),
        ("epochal.nothing_here:X", "cannot import"),
        ("epochal.train.steps:Missing", "has no"),
        ("epochal.train.trainer:Trainer", "not a train step class"),
    ]:
        with pytest.raises(ConfigError, match="training.train_step") as info:
            load_train_step(spec)
        assert match in str(info.value)
    with pytest.raises(ConfigError, match="training.train_step_kwargs"):
        trainer(tmp_path / "k", "--training.train_step_kwargs={alpha = 1}")
    with pytest.raises(ConfigError, match="training.train_step"):
        trainer(tmp_path / "m", "--training.train_step=tests.train.no_such_module:Step")
    tr = trainer(tmp_path / "d", "--training.train_step=tests.train.test_train_steps:NoDict")
    with pytest.raises(ValueError, match=r"\(loss, \{'name': value\}\)"):
        tr.train_step(tr.data.train_loader.stream())
    with pytest.raises(TypeError, match="neither loss_func nor get_loss_func"):
        Incomplete()


def test_custom_step_from_the_command_line(tmp_path):
    from epochal.cli import main

    rc = main(
        [
            "train",
            "--preset=tiny",
            f"--run_dir={tmp_path}",
            "--data.corpus=",
            "--data.mock=true",
            "--data.seq_length=8",
            "--model.hidden_size=32",
            "--model.num_layers=2",
            "--model.ffn_hidden_size=64",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=4",
            "--training.train_iters=2",
            "--training.eval_iters=0",
            "--scheduler.lr_warmup_iters=0",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            f"--training.train_step={CUSTOM}",
            f"--training.train_step_kwargs={{keytoken_ids = {KEYS}, alpha = {ALPHA}}}",
        ]
    )
    assert rc in (0, None)
    trains = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert len(trains) == 2 and all("lm loss" in r for r in trains)
    saved = tomllib.loads((tmp_path / "config.toml").read_text())["training"]
    assert saved["train_step"] == CUSTOM
    assert saved["train_step_kwargs"] == {"keytoken_ids": KEYS, "alpha": ALPHA}


def test_partial_binds_like_megatron():
    """forward_step returns (output, loss_func) where loss_func takes only the output."""
    step = GPTTrainStep()
    mb = {
        "tokens": torch.zeros(1, 4, dtype=torch.long),
        "labels": torch.ones(1, 4, dtype=torch.long),
        "loss_mask": torch.tensor([[1.0, 1.0, 0.0, 0.0]]),
    }
    seen = {}

    def model(tokens, position_ids, attention_mask, labels=None):
        seen.update(position_ids=position_ids, attention_mask=attention_mask, labels=labels)
        return torch.tensor([[1.0, 3.0, 100.0, 100.0]])

    output, loss_func = step.forward_step(iter([mb]), model)
    assert isinstance(loss_func, partial)
    loss, logged = loss_func(output)
    assert loss.item() == 2.0 and logged["lm loss"].item() == 2.0
    assert seen["position_ids"] is None and seen["labels"] is mb["labels"]
