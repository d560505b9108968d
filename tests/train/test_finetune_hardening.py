"""Fine-tuning runs: every validation row scored once, packed heads, head LR and tables at resume, labels.

- validation scores each row of the table exactly once, a partial last global batch
  and a table smaller than one global batch included: the loss and metrics equal a
  direct computation over all rows with the trained model;
- ``data.pack_sequences`` with a head gives the unpacked run's losses and metrics
  (the convolutional residue head, which reads padding, is refused);
- ``finetune.head_lr`` changed, or turned on, at resume takes effect; another
  ``finetune.split`` / ``train_file`` is refused naming the option;
- a regression label beyond float32's range is refused naming the file and row, and
  steps skipped for non-finite gradients are reported in the run summary.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from epochal.data.datasets.labelled import (
    LabelledDataError,
    LabelledSequenceDataset,
    LabelVocab,
    read_labelled_table,
)
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.model.config import ConfigError
from epochal.train.config import build_config
from epochal.train.observe.metrics import read_metrics
from epochal.train.state.encoder_init import finetune_overrides
from epochal.train.trainer import Trainer
from tests.train import finetune_data as D

LABELS = {"sequence_regression": 1, "sequence_classification": 2, "residue_classification": 2}


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    return D.pretrained_esm(tmp_path_factory.mktemp("ft-hard") / "pre")


def _config(run, init, train, valid, head, *extra):
    args = [
        *D.finetune_args(run, init, train, valid, head, LABELS[head]),
        "--scheduler.lr_warmup_iters=0",
        *extra,
    ]
    return build_config(preset=None, overrides=[*finetune_overrides(None, args), *args])


def _direct(trainer, table, head, run):
    """Loss and metrics of the trained model over every row of ``table`` at once."""
    rows = read_labelled_table(table, head)
    vocab = None if head == "sequence_regression" else LabelVocab.load(run / "label_vocab.json")
    ds = LabelledSequenceDataset(
        rows.sequences, rows.labels, ESM2Tokenizer(), task=head, seq_length=32, vocab=vocab
    )
    batch = {k: torch.stack([ds[i][k] for i in range(len(ds))]) for k in ds[0]}
    model = trainer.model_parts[0].eval()
    with torch.no_grad():
        out = model(
            batch["tokens"], None, batch["padding_mask"], residue_mask=batch["residue_mask"]
        )
    if head == "sequence_regression":
        x, y = out.reshape(-1).double(), batch["labels"].reshape(-1).double()
        return F.mse_loss(x, y).item(), {"mse": F.mse_loss(x, y).item(), "pearson": None}
    labels = batch["labels"]
    loss = F.cross_entropy(out.reshape(-1, 2).float(), labels.reshape(-1), ignore_index=-100)
    scored = labels >= 0
    accuracy = (out.argmax(-1) == labels)[scored].double().mean().item()
    return loss.item(), {"accuracy": accuracy}


@pytest.mark.parametrize(
    "head, rows, micro_batch",
    [
        ("sequence_classification", 12, 2),  # a global batch and a half (global batch 8)
        ("sequence_regression", 6, 4),  # fewer rows than one global batch
    ],
)
def test_validation_scores_every_row_exactly_once(init, tmp_path, head, rows, micro_batch):
    train = D.write_table(tmp_path / "train.csv", head, 16, 1)
    valid = D.write_table(tmp_path / "valid.csv", head, rows, 2)
    run = tmp_path / "run"
    cfg = _config(
        run, init, train, valid, head, "--training.train_iters=1",
        f"--training.micro_batch_size={micro_batch}",
    )  # fmt: skip
    trainer = Trainer(cfg, log=False)
    result = trainer.train()
    loss, metrics = _direct(trainer, valid, head, run)
    assert result.eval_loss == pytest.approx(loss, abs=1e-6)
    for key, value in metrics.items():
        if value is not None:
            assert trainer.last_eval_logged[key] == pytest.approx(value, abs=1e-6), key
    # a head's loss is no token cross-entropy: no perplexity anywhere
    record = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert "ppl" not in record and result.eval_ppl is None


def test_packed_heads_equal_unpacked(init, tmp_path):
    for head, extra in (
        ("sequence_classification", []),
        ("sequence_regression", []),
        ("residue_classification", ["--model.residue_head=linear"]),
    ):
        train = D.write_table(tmp_path / f"{head}.csv", head, 16, 1)
        valid = D.write_table(tmp_path / f"{head}-v.csv", head, 6, 2)
        runs = {}
        for pack in ("false", "true"):
            cfg = _config(
                tmp_path / f"{head}-{pack}", init, train, valid, head, *extra,
                "--training.train_iters=1", "--training.global_batch_size=4",
                f"--data.pack_sequences={pack}",
            )  # fmt: skip
            trainer = Trainer(cfg, log=False)
            runs[pack] = (trainer.train(), trainer.last_eval_logged)
        (plain, plain_logged), (packed, packed_logged) = runs["false"], runs["true"]
        assert packed.losses == pytest.approx(plain.losses, abs=1e-5), head
        assert packed.eval_loss == pytest.approx(plain.eval_loss, abs=1e-5), head
        assert packed_logged == pytest.approx(plain_logged, abs=1e-4), head


def test_packing_the_convolutional_residue_head_is_refused(init, tmp_path):
    table = D.write_table(tmp_path / "t.csv", "residue_classification", 4, 1)
    with pytest.raises(ConfigError, match="data.pack_sequences.*model.residue_head='linear'"):
        _config(tmp_path, init, table, None, "residue_classification", "--data.pack_sequences=true")


def test_a_packed_tail_is_not_scored():
    """Under sequence parallelism the packed row gets a tail: its regression target is NaN."""
    from epochal.data.loading.packing import pack_padded_batch
    from epochal.train.steps.finetune import SequenceRegressionStep

    batch = {
        "tokens": torch.tensor([[0, 5, 6, 2, 1], [0, 7, 2, 1, 1]]),
        "padding_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
        "labels": torch.tensor([[0.5, 1.0], [2.0, 3.0]]),  # [b, num_labels], not per token
    }
    packed = pack_padded_batch(batch, pad_to_multiple_of=4, per_sample_keys=("labels",))
    assert packed["tokens"].shape == (1, 8) and packed["labels"].shape == (3, 2)
    assert torch.isnan(packed["labels"][2]).all()
    output = torch.tensor([[0.5, 1.0], [2.0, 4.0], [9.0, 9.0]])
    loss, _ = SequenceRegressionStep().loss_func(packed["labels"], False, output)
    assert loss.item() == pytest.approx(1.0 / 4)  # (4 - 3)^2 over the 4 scored targets


def test_head_lr_changed_or_turned_on_at_resume_takes_effect(init, tmp_path):
    head = "sequence_classification"
    train = D.write_table(tmp_path / "train.csv", head, 16, 1)
    run = tmp_path / "run"
    save = [
        "--checkpoint.save_interval=1",
        "--training.eval_iters=0",
        "--training.global_batch_size=4",
    ]

    def lr_mults(steps, *extra):
        trainer = Trainer(
            _config(run, init, train, None, head, *save, f"--training.train_iters={steps}", *extra),
            log=False,
        )
        trainer.train()
        groups = {g["name"]: g for g in trainer.optimizers.param_groups}
        return {k: g.get("lr_mult", 1.0) for k, g in groups.items()}, groups

    assert "head_decay" not in lr_mults(1)[0]
    mults, groups = lr_mults(2, "--finetune.head_lr=0.03")  # turned on at resume
    assert mults["head_decay"] == pytest.approx(10.0)
    mults, groups = lr_mults(3, "--finetune.head_lr=0.006")  # changed at resume
    assert mults["head_decay"] == pytest.approx(2.0)
    assert groups["head_decay"]["lr"] == pytest.approx(2.0 * groups["decay"]["lr"])


def test_resuming_with_other_rows_is_refused(init, tmp_path):
    from epochal.train.state.run_dir import check_resume_config

    head = "sequence_classification"
    train = D.write_table(tmp_path / "train.csv", head, 16, 1)
    other = D.write_table(tmp_path / "other.csv", head, 16, 3)
    run = tmp_path / "run"
    base = ["--training.train_iters=1", "--training.eval_iters=0", "--checkpoint.save_final=true"]
    first = Trainer(
        _config(run, init, train, None, head, *base, "--finetune.split=75,25"), log=False
    )
    folder = first.train().last_checkpoint
    for change, option in (
        (["--finetune.split=50,50"], "finetune.split"),
        ([f"--finetune.train_file={other}", "--finetune.split=75,25"], "finetune.train_file"),
    ):
        cfg = _config(run, init, train, None, head, *base, *change)
        with pytest.raises(ConfigError, match=f"checkpoint.resume.*{option}"):
            check_resume_config(folder, cfg)


def test_regression_labels_beyond_float32_are_refused(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("sequence,label\nMKTAYIAKQR,0.5\nMKTAYIAKQR,1e39\n")
    with pytest.raises(LabelledDataError, match=r"t\.csv: row 2: .*1e39.*float32"):
        read_labelled_table(table, "sequence_regression")


def test_skipped_steps_are_in_the_run_summary(tmp_path, capsys):
    cfg = build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={tmp_path}", "--data.corpus=", "--data.mock=true", "--data.seq_length=16",
            "--model.hidden_size=32", "--model.num_layers=1", "--model.num_attention_heads=2",
            "--model.vocab_size=64", "--training.train_iters=2", "--training.micro_batch_size=2",
            "--training.global_batch_size=2", "--training.eval_iters=0",
            "--training.device=cpu", "--logging.progress=false", "--logging.tensorboard=false",
        ],
    )  # fmt: skip
    nan = lambda labels, logits, mask: logits.float().sum() * math.nan  # noqa: E731
    result = Trainer(cfg, loss_fn=nan).train()
    assert result.skipped_steps == 2
    assert "2 of 2 steps skipped: their gradients were not finite" in capsys.readouterr().out
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records if r["kind"] == "train"] == [1, 1]
