"""Fine-tuning a GPT on chat rows (``[sft]``): the loss, packing, validation, the preset, errors."""

from __future__ import annotations

import pytest
import torch

from epochal.data.sft import build_sft_datasets, load_chat_tokenizer
from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.model.config import ConfigError
from epochal.train.config import build_config
from epochal.train.trainer import Trainer
from tests.parallel import sft_worker as W


def _token_ce(model: torch.nn.Module, samples: list[dict[str, torch.Tensor]]) -> tuple[float, int]:
    """Summed cross-entropy over the samples' loss tokens (float64) and their number."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in samples:
            mask = s.get("attention_mask")
            logits = model(
                s["tokens"][None],
                s["position_ids"][None] if mask is not None else None,
                mask[None] if mask is not None else None,
            ).double()
            ce = torch.nn.functional.cross_entropy(logits[0], s["labels"], reduction="none")
            total += float((ce * s["loss_mask"].double()).sum())
            count += int(s["loss_mask"].sum())
    return total, count


@pytest.mark.parametrize("packing", [False, True])
def test_step_and_validation_losses_are_token_means_over_the_global_batch(tmp_path, packing):
    """Step 1's loss = summed CE over the global batch's loss tokens / their number (not
    the mean of its micro-batches' means); the validation loss = the token mean over
    every validation row (a partial last global batch included)."""
    train = W.write_rows(tmp_path, 0, 40, "train.jsonl")
    valid = W.write_rows(tmp_path, 40, 13, "valid.jsonl")
    cfg = W.config(
        str(tmp_path / "run"),
        [
            f"--sft.train_file={train}",
            f"--sft.valid_file={valid}",
            "--sft.split=",
            f"--sft.packing={str(packing).lower()}",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=8",
            "--training.train_iters=1",
        ],
    )
    tr = Trainer(cfg, log=False)
    model = tr.model_parts[0]
    first = [tr.data.train_loader.dataset[g] for g in range(8)]
    total, count = _token_ce(model, first)
    means = [_token_ce(model, first[i : i + 2]) for i in range(0, 8, 2)]
    mean_of_means = sum(s / n for s, n in means) / len(means)
    rows = tr.data.valid_loader.dataset.dataset
    v_total, v_count = _token_ce(model, [rows[i] for i in range(len(rows))])
    assert tr.evaluate() == pytest.approx(v_total / v_count, abs=1e-5)
    metrics = tr.train_step(iter(tr.data.train_loader))
    assert metrics["loss"] == pytest.approx(total / count, abs=2e-6)
    assert abs(total / count - mean_of_means) > 1e-4  # the two normalisations differ here
    assert metrics["lm loss"] == pytest.approx(total / count, abs=2e-6)


def test_packed_and_unpacked_runs_give_the_same_losses(tmp_path):
    """Every step's global batch is all the training rows (one row a sample, or packed):
    10 steps' losses and the validation loss agree within 1e-5."""
    train = W.write_rows(tmp_path, 0, 24, "train.jsonl")
    valid = W.write_rows(tmp_path, 24, 10, "valid.jsonl")
    tokenizer = load_chat_tokenizer(TOKENIZER_DIR)
    bins = len(build_sft_datasets(train, tokenizer, seq_length=80, packing=True).train)
    assert bins < 24
    common = [
        f"--sft.train_file={train}",
        f"--sft.valid_file={valid}",
        "--sft.split=",
        "--training.train_iters=10",
        "--training.eval_interval=10",
    ]
    unpacked = W.single(
        str(tmp_path / "unpacked"),
        [
            *common,
            "--sft.packing=false",
            "--training.micro_batch_size=4",
            "--training.global_batch_size=24",
        ],
    )
    packed = W.single(
        str(tmp_path / "packed"),
        [
            *common,
            "--sft.packing=true",
            "--training.micro_batch_size=1",
            f"--training.global_batch_size={bins}",
        ],
    )
    assert len(packed["losses"]) == 10
    assert packed["losses"][-1] < packed["losses"][0] - 0.5  # it learns
    assert packed["losses"] == pytest.approx(unpacked["losses"], abs=1e-5)
    assert packed["eval"] == pytest.approx(unpacked["eval"], abs=1e-5)


def test_sft_tiny_preset_trains_end_to_end(tmp_path, capsys):
    """``epochal train --preset sft-tiny`` (3 steps): the packaged rows and tokenizer, the
    packing report, a falling loss and a validation loss."""
    from epochal.cli import main as cli_main

    run = tmp_path / "run"
    args = ["train", "--preset", "sft-tiny", f"--run_dir={run}", "--training.device=cpu"]
    args += ["--training.train_iters=3", "--training.eval_interval=3", "--model.num_layers=2"]
    assert cli_main(args) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "real tokens" in text and "loss on completion" in text
    assert (run / "checkpoints").is_dir()
    saved = (run / "config.toml").read_text()
    assert "[sft]" in saved and str(CHAT_FILE) in saved
    # the run names its tokenizer, so generate and convert rebuild it from config.toml
    assert f'tokenizer_model = "{TOKENIZER_DIR}"' in saved
    assert 'tokenizer_type = "HuggingFaceTokenizer"' in saved


@pytest.mark.parametrize(
    ("preset", "overrides", "option"),
    [
        ("bert-tiny", [f"--sft.train_file={CHAT_FILE}"], "sft.train_file"),
        (None, [f"--sft.train_file={CHAT_FILE}", "--data.mock=true"], "sft.train_file"),
        ("sft-tiny", ["--data.pack_sequences=true"], "data.pack_sequences"),
        ("sft-tiny", ["--data.reset_attention_mask=true"], "data.reset_attention_mask"),
        ("sft-tiny", ["--data.eod_mask_loss=true"], "data.eod_mask_loss"),
        ("sft-tiny", ["--sft.loss_on=assistant"], "sft.loss_on"),
        ("sft-tiny", ["--sft.overlength=cut"], "sft.overlength"),
        ("sft-tiny", [f"--sft.valid_file={CHAT_FILE}", "--sft.split=95,5"], "sft.split"),
        ("sft-tiny", ["--sft.split=90,x"], "sft.split"),
        (None, ["--data.mock=true", "--sft.packing=true"], "sft.packing"),
        (None, ["--data.mock=true", f"--sft.valid_file={CHAT_FILE}"], "sft.valid_file"),
    ],
)
def test_contradicting_sft_options_are_refused_naming_the_option(preset, overrides, option):
    with pytest.raises(ConfigError) as info:
        build_config(preset=preset, overrides=overrides)
    assert info.value.option == option, str(info.value)


def test_another_data_source_replaces_the_presets_rows():
    cfg = build_config(preset="sft-tiny", overrides=["--data.mock=true"])
    assert not cfg.sft.enabled and cfg.sft.tokenizer == "" and cfg.data.mock


@pytest.mark.parametrize(
    ("overrides", "option", "text"),
    [
        (["--sft.train_file=missing.jsonl"], "sft.train_file", "does not exist"),
        (["--sft.tokenizer="], "sft.tokenizer", "checkpoint.init_from"),
        (["--sft.tokenizer=nowhere"], "sft.tokenizer", "not a folder"),
        (["--data.seq_length=32"], "sft.train_file", "overlength"),
    ],
)
def test_unusable_sft_inputs_are_refused_naming_the_option(tmp_path, overrides, option, text):
    cfg = build_config(
        preset="sft-tiny", overrides=[f"--run_dir={tmp_path}", "--training.device=cpu", *overrides]
    )
    with pytest.raises(ConfigError) as info:
        Trainer(cfg, log=False)
    assert info.value.option == option and text in str(info.value)


def test_a_resumed_sft_run_continues_exactly(tmp_path):
    """2 steps, a checkpoint, a new process's trainer resuming for 2 more: the losses of the
    uninterrupted 4-step run, bit for bit (the loss tokens are counted from the resumed
    consumed_samples)."""
    train = W.write_rows(tmp_path, 0, 30, "train.jsonl")
    common = [
        f"--sft.train_file={train}",
        "--sft.split=",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=4",
        "--scheduler.lr_decay_iters=4",
        "--checkpoint.save_interval=2",
    ]
    straight = W.single(str(tmp_path / "straight"), [*common, "--training.train_iters=4"])
    first = W.single(str(tmp_path / "resumed"), [*common, "--training.train_iters=2"])
    second = W.single(str(tmp_path / "resumed"), [*common, "--training.train_iters=4"])
    assert first["losses"] + second["losses"] == straight["losses"]


def test_unpacked_micro_batches_drop_trailing_padding_with_the_same_losses(tmp_path):
    """Without ``training.layout_invariant`` an unpacked micro-batch is cut after its last
    loss token (a multiple of 8): narrower batches, the full-width run's losses (1e-5)."""
    train = W.write_rows(tmp_path, 0, 16, "train.jsonl")
    common = [
        f"--sft.train_file={train}",
        "--sft.split=",
        "--sft.packing=false",
        "--data.seq_length=128",
        "--training.micro_batch_size=4",
        "--training.global_batch_size=8",
        "--training.train_iters=3",
    ]
    cut = Trainer(W.config(str(tmp_path / "cut"), [*common, "--training.layout_invariant=false"]))
    assert cut.train_step_handler.trims_padding
    batch = cut.train_step_handler.get_batch(iter(cut.data.train_loader))
    tokens, _, loss_mask = batch[:3]
    assert tokens.shape[1] % 8 == 0 and tokens.shape[1] < 128  # data.seq_length
    assert loss_mask[:, -8:].any()  # nothing with loss was cut
    whole = W.single(str(tmp_path / "whole"), [*common, "--training.layout_invariant=true"])
    trimmed = W.single(str(tmp_path / "trimmed"), [*common, "--training.layout_invariant=false"])
    assert trimmed["losses"] == pytest.approx(whole["losses"], abs=1e-5)


def test_a_resume_on_other_rows_at_the_same_path_is_refused_naming_the_file(tmp_path):
    """The train file rewritten with other rows (as many: the same (epoch, row) numbers):
    the sample digests cover each row's tokens, so the resume stops naming the file."""
    train = W.write_rows(tmp_path, 0, 30, "train.jsonl")
    common = [
        f"--sft.train_file={train}",
        "--sft.split=",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=4",
        "--checkpoint.save_interval=2",
    ]
    run = str(tmp_path / "run")
    W.single(run, [*common, "--training.train_iters=2"])
    W.write_rows(tmp_path, 30, 30, "train.jsonl")
    with pytest.raises(ConfigError) as info:
        W.single(run, [*common, "--training.train_iters=4"])
    text = str(info.value)
    assert info.value.option == "sft.train_file" and text.startswith(f"sft.train_file: {train}: ")
    assert "sample digests differ: step 2: recorded" in text and "checkpoint.init_from" in text


def test_rows_errors_name_the_option_of_their_file_and_the_data_line_is_short(tmp_path):
    train = W.write_rows(tmp_path, 0, 8, "train.jsonl")
    valid = W.write_rows(tmp_path, 8, 1, "valid.jsonl")
    common = [f"--sft.train_file={train}", "--sft.split=", "--training.train_iters=1"]
    cfg = W.config(str(tmp_path / "run"), [*common, f"--sft.valid_file={valid}"])
    from epochal.train.inputs.sft import build_sft_train_datasets

    said = []
    *_, description = build_sft_train_datasets(cfg, log=said.append)
    assert description == (
        f"fine-tuning rows of {train} (packed, loss on completion): 8 train samples from 4 "
        "packed samples, 1 validation sample, 80 tokens each"
    )
    assert [line.split(":")[0] for line in said if not line.startswith("sft rows")] == [
        "sft train",
        "sft valid",
    ]
    valid.write_bytes(valid.read_bytes() + b'{"prompt": "caf\xe9", "completion": "x"}\n')
    cfg = W.config(str(tmp_path / "run"), [*common, f"--sft.valid_file={valid}"])
    with pytest.raises(ConfigError) as info:
        build_sft_train_datasets(cfg)
    assert info.value.option == "sft.valid_file"
    assert f"{valid} line 2 column 16: not UTF-8" in str(info.value)


def test_digests_recorded_in_another_identity_format_are_not_compared(tmp_path):
    from epochal.train.inputs.sft import build_sft_train_datasets
    from epochal.train.state.sample_check import resume_sample_check

    train = W.write_rows(tmp_path, 0, 8, "train.jsonl")
    cfg = W.config(str(tmp_path / "run"), [f"--sft.train_file={train}", "--sft.split="])
    samples = build_sft_train_datasets(cfg)[0]
    entry = {"step": 1, "first_sample": 0, "samples": 8, "digest": "0123456789abcdef"}
    line = resume_sample_check({"sample_digests": [entry]}, samples)  # an earlier checkpoint
    assert line.startswith("warning: sample digests not compared: the checkpoint names")
    with pytest.raises(ConfigError, match="sample digests differ: step 1: recorded 0123"):
        resume_sample_check({"sample_digests": [{**entry, "identity": "sft rows+tokens"}]}, samples)
