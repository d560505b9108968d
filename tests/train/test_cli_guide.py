"""``epochal train`` guides: commands in one folder do not collide, checks come before any data,
and every run ends with the next commands, which run as printed."""

from __future__ import annotations

import json
import re
import shlex
import warnings

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.train.config import build_config
from epochal.train.next_steps import next_commands
from tests.train import finetune_data as D

# The quick start, shrunk to seconds: Megatron's mock corpus, a 2-layer model, 2 steps.
QUICK = [
    "--training.device=cpu",
    "--data.mock=true",
    "--model.vocab_size=128",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=2",
    "--model.num_query_groups=1",
    "--model.ffn_hidden_size=64",
    "--data.seq_length=16",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.train_iters=2",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def _run_dir(*overrides: str) -> str:
    return build_config(preset="tiny", overrides=list(overrides), require_data=False).run_dir


def test_quick_start_then_parallel_command_and_print_config_do_not_collide(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    launched: list[list[str]] = []
    monkeypatch.setattr(
        "epochal.parallel.launch.relaunch", lambda parallel, argv, **kw: launched.append(argv) or 0
    )
    quick = _run_dir(*QUICK)
    assert cli_main(["train", *QUICK]) == 0
    out = capsys.readouterr().out
    assert f"run directory {quick}" in out and "trained steps 1-2" in out
    # it ends with the next commands, and they run as printed
    nxt = out.split("\nnext:\n", 1)[1].splitlines()
    assert (
        nxt[0] == f"  epochal generate --checkpoint {quick} --prompt-ids 1,2,3 --max-new-tokens 8"
    )
    assert f"  epochal plot {quick}" in nxt
    further = f"epochal train --config {quick}/config.toml --run_dir={quick} "
    further += "--training.train_iters=4 --scheduler.lr_decay_iters=2"
    assert f"  train further (learning-rate schedule kept): {further}" in nxt
    assert cli_main(shlex.split(nxt[0])[1:]) == 0
    assert cli_main(["plot", quick]) == 0
    capsys.readouterr()

    # the same command again: nothing to do, and it says how to go on
    assert cli_main(["train", *QUICK]) == 0
    out = capsys.readouterr().out
    assert f"nothing to do: {quick} is already at step 2" in out
    assert f"To train further, its learning-rate schedule kept: {further};" in out
    assert "--run_dir=NEW_DIR" in out

    # a parallel command (torchrun is launched by `epochal train` itself) gets its own run
    parallel = _run_dir(*QUICK, "--parallel.data_parallel=2")
    assert cli_main(["train", *QUICK, "--parallel.data_parallel=2"]) == 0
    assert len(launched) == 1 and parallel != quick and not (tmp_path / parallel).exists()
    err = capsys.readouterr().err  # the preset's note only (data.mock replaces its corpus)
    assert (
        err.startswith("epochal train: note: preset tiny's values give way")
        and err.count("\n") == 1
    )

    # --print-config writes a file that trains in a directory of its own, as does the wizard's
    assert cli_main(["train", *QUICK, "--print-config"]) == 0
    (tmp_path / "mine.toml").write_text(capsys.readouterr().out)
    assert build_config(config_file=tmp_path / "mine.toml").run_dir == "runs/mine"
    assert cli_main(["config", "--defaults", "--output", "job.toml"]) == 0
    assert build_config(config_file=tmp_path / "job.toml").run_dir == "runs/job"
    assert len({quick, parallel, "runs/mine", "runs/job"}) == 4
    capsys.readouterr()

    # a larger train_iters continues the quick start in its directory
    assert cli_main(["train", *QUICK, "--training.train_iters=3"]) == 0
    assert "trained steps 3-3 (resumed from step 2)" in capsys.readouterr().out

    # another run pointed at that directory is refused once, before anything is launched
    other = [*QUICK, f"--run_dir={quick}", "--model.hidden_size=48", "--parallel.data_parallel=2"]
    assert cli_main(["train", *other]) == 2
    err = capsys.readouterr().err
    assert len(launched) == 1  # torchrun was not started
    assert err.count("error:") == 1 and "model.hidden_size: 32 -> 48" in err
    assert "--run_dir=NEW_DIR" in err
    # under an outer torchrun every rank refuses, and only rank 0 says so
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, says in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        assert cli_main(["train", *other]) == 2
        assert ("holds another run" in capsys.readouterr().err) is says


def _train_records(run_dir) -> dict[int, dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return {r["step"]: r for r in records if r.get("kind") == "train"}


def test_the_train_further_command_continues_the_learning_rate_schedule(
    tmp_path, monkeypatch, capsys
):
    """The printed command, run, goes on along the finished run's schedule.

    The reference is a run that never stopped, trained to the new length with the
    decay ending where the first run's did (Megatron's fixed ``--lr-decay-iters``): the
    resumed run's learning rate equals it at every step (the finished run's own rates
    up to its last step, ``min_lr`` after), and so do its samples and losses.
    """
    monkeypatch.chdir(tmp_path)
    schedule = [
        "--optimizer.lr=0.01",
        "--optimizer.min_lr=0.001",
        "--scheduler.lr_warmup_fraction=0.25",
    ]
    first = [*QUICK, *schedule, "--training.train_iters=4", "--run_dir=runs/a"]
    assert cli_main(["train", *first]) == 0
    nxt = capsys.readouterr().out.split("\nnext:\n", 1)[1].splitlines()
    label = "  train further (learning-rate schedule kept): "
    further = [line.removeprefix(label) for line in nxt if line.startswith(label)]
    assert len(further) == 1 and "--training.train_iters=8" in further[0]
    finished = _train_records(tmp_path / "runs" / "a")
    assert cli_main(shlex.split(further[0])[1:]) == 0
    out = capsys.readouterr().out
    assert "trained steps 5-8 (resumed from step 4)" in out
    assert "schedule is recomputed" not in out
    straight = [*QUICK, *schedule, "--training.train_iters=8", "--scheduler.lr_decay_iters=4"]
    assert cli_main(["train", *straight, "--run_dir=runs/straight"]) == 0
    resumed = _train_records(tmp_path / "runs" / "a")
    reference = _train_records(tmp_path / "runs" / "straight")
    assert sorted(resumed) == sorted(reference) == list(range(1, 9))
    for step in range(1, 9):
        assert resumed[step]["lr"] == reference[step]["lr"], step
        for key in ("loss", "sample_digest"):
            assert resumed[step][key] == reference[step][key], (step, key)
    assert [finished[k]["lr"] for k in range(1, 5)] == [resumed[k]["lr"] for k in range(1, 5)]
    assert len({resumed[k]["lr"] for k in range(1, 5)}) == 4  # warmup then decay
    assert [resumed[k]["lr"] for k in range(5, 9)] == [pytest.approx(0.001)] * 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_is_checked_before_any_data_is_built(tmp_path, monkeypatch, capsys):
    def no_data(*args, **kwargs):
        raise AssertionError("data was built before the device check")

    monkeypatch.setattr("epochal.train.inputs.loaders.build_data", no_data)
    args = ["train", f"--run_dir={tmp_path / 'run'}", "--training.device=cuda"]
    assert cli_main(args) == 2  # the tiny preset, whose stdlib corpus is never prepared
    err = capsys.readouterr().err
    assert "training.device: is 'cuda' but no CUDA device is available" in err
    assert "--training.device=cpu" in err and not (tmp_path / "run").exists()


def test_lora_run_prints_trainable_parameters_and_its_predictions_command_runs(tmp_path, capsys):
    from epochal.model import build_model
    from epochal.model.config import ModelConfig
    from epochal.model.lora import is_lora_name

    init = D.pretrained_esm(tmp_path / "pre")
    train = D.write_table(tmp_path / "train.csv", "residue_classification", 16, 1)
    valid = D.write_table(tmp_path / "valid.csv", "residue_classification", 4, 2)
    run = tmp_path / "lora"
    args = D.finetune_args(run, init, train, valid, "residue_classification", 2)
    extra = ["--model.lora_rank=4", "--training.train_iters=2", "--checkpoint.save_final=true"]
    assert cli_main(["train", *args, *extra]) == 0
    out = capsys.readouterr().out
    state = json.loads(next((run / "checkpoints").glob("step_*/trainer_state.json")).read_text())
    model = build_model(ModelConfig.from_dict(state["model_config"]))
    names = dict(model.named_parameters())
    trainable = sum(p.numel() for n, p in names.items() if is_lora_name(n) or n.startswith("head."))
    total = sum(p.numel() for p in names.values())
    assert 0 < trainable < total
    # PEFT's print_trainable_parameters wording
    assert (
        f"trainable params: {trainable:,d} || all params: {total:,d} || "
        f"trainable%: {100 * trainable / total:.4f}"
    ) in out
    (predict,) = [line.strip() for line in out.splitlines() if "epochal embed" in line]
    assert predict == (
        f"epochal embed --checkpoint {run} --input {valid} --output predictions.parquet "
        "--predictions"
    )
    argv = [
        a.replace("predictions.parquet", str(tmp_path / "p.parquet")) for a in shlex.split(predict)
    ]
    assert cli_main([*argv[1:], "--no-progress", "--device", "cpu"]) == 0


@pytest.mark.parametrize(
    ("preset", "overrides", "first"),
    [
        ("tiny", [], r"epochal generate --checkpoint runs/tiny --prompt 'def main\(' "),
        ("t5-tiny", [], r"epochal generate --checkpoint runs/t5-tiny --prompt "),
        ("bert-tiny", [], r"epochal fill-mask --checkpoint runs/bert-tiny --text '.*\[MASK\]"),
        ("esm-tiny", [], r"epochal fill-mask --checkpoint runs/esm-tiny --text '.*<mask>"),
        (
            "esm-tiny",
            ["--data.mock=false", "--data.protein_path=p.fasta"],
            r"epochal fill-mask .*\n.*epochal embed --checkpoint runs/esm-tiny-\w+ --input p.fasta",
        ),
    ],
)
def test_next_commands_match_the_model(preset, overrides, first):
    config = build_config(preset=preset, overrides=overrides, require_data=False)
    cmds = next_commands(config, config.run_dir, final_step=config.training.train_iters)
    assert re.match(first, "\n".join(cmds)), cmds
    assert f"epochal convert {config.run_dir} hf/" in "\n".join(cmds)
    stopped = next_commands(config, config.run_dir, final_step=1)
    assert not any(line.startswith("train further") for line in stopped)


def test_counts_are_worded_for_one_and_many():
    from epochal._text import plural
    from epochal.train.observe.throughput import device_name

    assert (plural(1, "process"), plural(2, "process")) == ("1 process", "2 processes")
    assert plural(1024, "token", fmt=",") == "1,024 tokens"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert device_name(torch.device("cpu")) == "cpu (1 thread)"
    finally:
        torch.set_num_threads(threads)


def test_torch_dist_conversion_prints_no_warning(tmp_path):
    from epochal.convert.megatron.legacy import load_megatron_checkpoint
    from epochal.convert.megatron.legacy_save import save_megatron_checkpoint
    from epochal.model.config import ModelConfig

    config = ModelConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_megatron_checkpoint(
            config, build_model_state(config), tmp_path / "mg", ckpt_format="torch_dist"
        )
        load_megatron_checkpoint(tmp_path / "mg")
    assert not [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


def build_model_state(config):
    from epochal.model import build_model

    return build_model(config).state_dict()
