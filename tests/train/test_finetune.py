"""``epochal train`` with a fine-tuning head: runs, saved vocabulary, frozen encoder, head LR, errors."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.train.observe.metrics import read_metrics
from tests.train import finetune_data as D

FAST = ["--training.train_iters=2", "--training.eval_iters=1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("ft")
    out = {"init": D.pretrained_esm(root / "pre")}
    for task in ("sequence_regression", "sequence_classification", "residue_classification"):
        out[task] = D.write_table(root / f"{task}.csv", task, 24, 1)
        out[task + "-valid"] = D.write_table(root / f"{task}-valid.tsv", task, 8, 2, sep="\t")
    return out


def _args(files, run_dir, task, labels, *extra, valid=True):
    return [
        "train",
        *D.finetune_args(
            run_dir,
            files["init"],
            files[task],
            files[task + "-valid"] if valid else None,
            task,
            labels,
        ),
        *FAST,
        *extra,
    ]


def test_sequence_classification_run_saves_vocab_and_logs_accuracy(files, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        cli_main(_args(files, run, "sequence_classification", 2, "--checkpoint.save_final=true"))
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "weights it lacks start fresh: head.fc1.bias, head.fc1.weight, head.fc2.bias, head.fc2.weight"
        in out
    )
    assert json.loads((run / "label_vocab.json").read_text()) == {"labels": ["high", "low"]}
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]
    assert {"accuracy", "accuracy high", "accuracy low"} <= set(evals[-1])
    saved = json.loads(next((run / "checkpoints").glob("step_*/trainer_state.json")).read_text())
    assert saved["model_config"]["head"] == "sequence_classification"


def test_regression_with_frozen_encoder_and_head_lr(files, tmp_path):
    from epochal.train.config import build_config
    from epochal.train.state.encoder_init import finetune_overrides, read_encoder
    from epochal.train.trainer import Trainer

    args = D.finetune_args(
        tmp_path, files["init"], files["sequence_regression"], None, "sequence_regression", 1
    )
    args += [
        *FAST,
        "--model.freeze_encoder=true",
        "--finetune.head_lr=0.03",
        "--finetune.split=50,50",
    ]
    config = build_config(preset=None, overrides=[*finetune_overrides(None, args), *args])
    trainer = Trainer(config, log=False)
    model = trainer.model_parts[0]
    fresh_head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("head.")}
    trainer.train()
    _, pretrained, _ = read_encoder(files["init"])
    for key, value in model.state_dict().items():
        if key.startswith("head."):
            assert not torch.equal(value, fresh_head[key]), key  # trained
        else:
            assert torch.equal(value, pretrained[key]), key  # frozen at the checkpoint's values
    groups = {g["name"]: g for g in trainer.optimizers.param_groups}
    assert groups["head_decay"]["lr_mult"] == pytest.approx(10.0)
    assert not groups["decay"]["params"]  # the frozen encoder has nothing to optimize
    assert {"mse", "pearson"} <= set(trainer.last_eval_logged)


def test_unseen_validation_class_is_reported_not_fatal(files, tmp_path):
    train = files["residue_classification"]
    valid = tmp_path / "valid.csv"
    valid.write_text("sequence,label\nMKTAYIAKQR,CCCXCCCCCC\nAILMFVWAAA,HHHHHHHHHH\n")
    args = _args(files, tmp_path / "run", "residue_classification", 2, valid=False)
    args += [f"--finetune.valid_file={valid}", "--training.global_batch_size=2"]
    assert cli_main(args) == 0
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals[-1]["unseen labels"] == pytest.approx(1 / 20)
    del train


def test_bad_tables_are_named(files, tmp_path, capsys):
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("sequence,label\nMKTAYIAK,CCCCHHHH\nMKTAY,CCC\n")
    args = _args(files, tmp_path / "r1", "residue_classification", 2, valid=False)
    args += [f"--finetune.train_file={wrong}"]
    assert cli_main(args) != 0
    err = capsys.readouterr().err
    assert "wrong.csv: row 2: 3 per-residue labels for a sequence of 5 residues" in err
    args = _args(
        files, tmp_path / "r2", "sequence_classification", 2, "--finetune.label_column=class"
    )
    assert cli_main(args) != 0
    assert "no column 'class'" in capsys.readouterr().err
    args = _args(files, tmp_path / "r3", "sequence_classification", 3)
    assert cli_main(args) == 2
    assert "model.num_labels" in capsys.readouterr().err


def test_wrong_checkpoints_are_refused(files, tmp_path, capsys):
    from epochal.model import build_model
    from epochal.model.config import ModelConfig
    from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

    gpt = ModelConfig(
        vocab_size=33,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    save_epochal_checkpoint(gpt, build_model(gpt).state_dict(), tmp_path / "gpt")
    args = _args(
        files,
        tmp_path / "r1",
        "sequence_regression",
        1,
        f"--checkpoint.init_from={tmp_path / 'gpt'}",
    )
    assert cli_main(args) != 0
    assert "holds a 'gpt' model, but a fine-tuning head" in capsys.readouterr().err
    # a fine-tuned classifier's head does not fit a regression head
    tuned = tmp_path / "tuned"
    assert (
        cli_main(_args(files, tuned, "sequence_classification", 2, "--checkpoint.save_final=true"))
        == 0
    )
    capsys.readouterr()
    args = _args(
        files, tmp_path / "r2", "sequence_regression", 1, f"--checkpoint.init_from={tuned}"
    )
    assert cli_main(args) != 0
    err = capsys.readouterr().err
    assert "the head does not fit" in err and "head.fc2.weight" in err
