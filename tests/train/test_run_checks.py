"""What is checked before a run starts, and what a resume or an evaluation says.

- options that cannot work are refused in one line naming them, before the run
  directory exists: an attention kernel the CPU lacks, NCCL on the CPU, a profile
  range after the run, an infinite split, a checkpoint that holds no encoder;
- the weights, gradients and AdamW state are checked against the device's memory
  (``training.memory_check=false`` overrides);
- extending a finished run says that the learning-rate schedule is recomputed, with
  the rate before and after and how to keep the earlier decay;
- BERT's perplexity is ``exp`` of the masked-LM loss alone.
"""

from __future__ import annotations

import math

import pytest

from epochal.cli import main as cli_main
from epochal.model.config import ConfigError
from epochal.train.config import build_config
from epochal.train.observe.metrics import read_metrics
from tests.train import finetune_data as D

QUIET = ["--logging.progress=false", "--logging.tensorboard=false", "--training.device=cpu"]
TINY_GPT = [
    "--data.corpus=", "--data.mock=true", "--data.seq_length=16", "--model.hidden_size=32",
    "--model.num_layers=1", "--model.num_attention_heads=2", "--model.vocab_size=64",
    "--training.micro_batch_size=2", "--training.global_batch_size=2", "--training.eval_iters=0",
    "--scheduler.lr_decay_style=linear", *QUIET,
]  # fmt: skip


@pytest.mark.parametrize(
    "overrides, option",
    [
        (["--training.attention_backend=cudnn"], "training.attention_backend"),
        (["--training.attention_backend=efficient"], "training.attention_backend"),
        (["--parallel.backend=nccl"], "parallel.backend"),
        (["--parallel.backend=nccl", "--parallel.data_parallel=2"], "parallel.backend"),
        (["--logging.profile_steps=[5,6]"], "logging.profile_steps"),
    ],
)
def test_options_that_cannot_run_are_refused_before_the_run_dir(
    tmp_path, capsys, overrides, option
):
    run = tmp_path / "run"
    args = ["train", f"--run_dir={run}", *TINY_GPT, "--training.train_iters=2", *overrides]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {option}: " in err and "Traceback" not in err
    assert not run.exists()


@pytest.mark.parametrize("split", ["inf,1", "1,inf", "1e308,1e308", "nan,1"])
def test_infinite_finetune_splits_are_refused(split):
    with pytest.raises(ConfigError, match="finetune.split.*finite"):
        build_config(preset=None, overrides=[f"--finetune.split={split}"])


def test_a_checkpoint_without_an_encoder_is_named(tmp_path, capsys):
    t5 = D.save_random_encoder(
        tmp_path / "t5", 1, type="t5", vocab_size=40, position_embedding_type="relative",
        activation="relu", normalization="RMSNorm",
    )  # fmt: skip
    table = D.write_table(tmp_path / "t.csv", "sequence_classification", 4, 1)
    args = D.finetune_args(tmp_path / "run", t5, table, None, "sequence_classification", 2)
    assert cli_main(["train", *args]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.init_from=" in err and "holds a 't5' model" in err
    assert "max_position_embeddings" not in err  # nothing the user did not set
    assert (
        cli_main(
            ["train", *TINY_GPT, f"--run_dir={tmp_path / 'g'}", "--model.head=sequence_regression"]
        )
        == 2
    )
    assert (
        "model.head: is an encoder option: set model.type='bert' or 'esm'"
        in capsys.readouterr().err
    )


def test_the_training_state_is_checked_against_the_memory(tmp_path, capsys, monkeypatch):
    from epochal.train.run_checks import preflight_model, state_memory

    monkeypatch.setattr(state_memory, "available_memory", lambda device: (8 * 10**9, "free"))
    run = tmp_path / "run"
    args = ["train", "--preset=gpu-1b", f"--run_dir={run}", "--training.device=cpu"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "training.device: the model's weights, gradients and AdamW state need 23.03 GB" in err
    assert "1,439,270,912 parameters" in err and "only 8.00 GB is free" in err
    assert "training.memory_check=false" in err and not run.exists()
    # the estimate: 4 bytes per parameter + 12 per trainable one, split by the layout
    cfg = build_config(preset=None, overrides=[*TINY_GPT, "--training.memory_check=false"])
    model = preflight_model(cfg)
    n = 0
    for p in __import__("epochal.model.build", fromlist=["x"]).build_model(model).parameters():
        n += p.numel()
    assert state_memory.state_bytes(cfg, model) == (16 * n, n, n)
    state_memory.check_state_memory(cfg, model, __import__("torch").device("cpu"))  # skipped
    sharded = build_config(
        preset=None,
        overrides=[*TINY_GPT, "--parallel.data_parallel=2", "--parallel.dp_sharding=optimizer"],
    )
    assert state_memory.state_bytes(sharded, model)[0] == 4 * n + 12 * n // 2


def test_extending_a_finished_run_says_the_schedule_is_recomputed(tmp_path, capsys):
    from epochal.train.state.checkpoint import Checkpointer
    from epochal.train.state.resume_notes import resume_notes
    from epochal.train.trainer import Trainer

    def config(steps, *extra):
        args = [f"--run_dir={tmp_path}", *TINY_GPT, f"--training.train_iters={steps}", *extra]
        return build_config(preset="tiny", overrides=[*args, "--checkpoint.save_interval=2"])

    first: list[float] = []
    trainer = Trainer(config(2))
    trainer.add_callback(lambda tr, step, rec: first.append(rec["lr"]))
    trainer.train()
    capsys.readouterr()
    saved = Checkpointer(tmp_path / "checkpoints").read_trainer_state(
        tmp_path / "checkpoints" / "step_0000002"
    )
    lrs = []
    trainer = Trainer(config(6))
    trainer.add_callback(lambda tr, step, rec: lrs.append(rec["lr"]))
    trainer.train()
    out = capsys.readouterr().out
    assert "the learning-rate schedule is recomputed for this configuration" in out
    assert "lr_decay_steps 2 -> 6" in out
    assert f"--scheduler.lr_decay_iters=2 --run_dir={tmp_path}" in out
    assert f"was {first[-1]:.3g} at step 2 and is {lrs[0]:.3g} at step 3" in out
    assert lrs[0] > first[-1]  # back up
    # keeping the earlier horizon: nothing to say, and the rate stays at its minimum
    assert resume_notes(saved, config(6, "--scheduler.lr_decay_iters=2")) == []


def test_bert_perplexity_is_that_of_the_masked_lm_loss(tmp_path):
    from tests.parallel import bert_worker as W

    out = W.single(
        str(tmp_path),
        [
            *W.PAIRS,
            "--training.train_iters=2",
            "--model.num_layers=1",
            "--training.global_batch_size=4",
        ],
    )
    record = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert "sop loss" in out["logged"]  # the loss is lm loss + sop loss
    assert record["ppl"] == pytest.approx(math.exp(out["logged"]["lm loss"]))
    assert record["ppl"] != pytest.approx(math.exp(record["loss"]))
