"""T5 training through ``epochal train``: the t5-tiny preset, compile, errors."""

from __future__ import annotations

import pytest

from epochal.model import ConfigError
from epochal.train.observe.metrics import read_metrics
from tests.parallel import t5_worker as W
from tests.train.synthetic import write_prose_jsonl


def test_t5_tiny_preset_trains_on_the_corpus_and_resumes_exactly(tmp_path, monkeypatch):
    """``epochal train --preset t5-tiny`` (shrunk): a fixed sentence-split corpus, WordPiece + sentinels."""
    from epochal.cli import main

    monkeypatch.setenv("EPOCHAL_CACHE", str(tmp_path / "cache"))
    small = [
        "--preset=t5-tiny",
        "--training.device=cpu",  # compared run to run on the CPU: the same with or without a GPU
        f"--data.corpus={write_prose_jsonl(tmp_path / 'prose.jsonl')}",  # not the stdlib: it differs per Python version
        "--data.wordpiece_vocab_size=1000",
        "--data.seq_length=64",
        "--data.seq_length_decoder=24",
        "--model.hidden_size=32",
        "--model.ffn_hidden_size=64",
        "--training.global_batch_size=8",
        "--training.eval_interval=2",
        "--training.eval_iters=1",
        "--scheduler.lr_warmup_iters=1",
        "--checkpoint.save_interval=2",
        "--logging.progress=false",
        "--logging.tensorboard=false",
    ]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert main(["train", *small, f"--run_dir={full}", "--training.train_iters=4"]) == 0
    first = [*small, f"--run_dir={parts}", "--scheduler.lr_decay_iters=4"]
    assert main(["train", *first, "--training.train_iters=2"]) == 0
    assert main(["train", *small, f"--run_dir={parts}", "--training.train_iters=4"]) == 0
    loss = {}
    for run in (full, parts):
        recs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
        loss[run] = {r["step"]: r["loss"] for r in recs}
        assert all("lm loss" in r for r in recs)
        evals = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]
        assert evals and all(0 <= r["lm accuracy"] <= 1 for r in evals)
    assert loss[parts] == loss[full]  # steps 3-4 after the resume, bit for bit
    assert loss[full][4] < loss[full][1]


@pytest.mark.slow  # compiling costs about a minute; BERT's compiled run covers the option
def test_compiled_t5_equals_eager(tmp_path):
    """``training.compile`` (each block compiled) gives the eager losses (relative bias, gated GELU)."""
    eager = W.single(str(tmp_path / "eager"), W.HF_STYLE)
    compiled = W.single(str(tmp_path / "compiled"), [*W.HF_STYLE, "--training.compile=true"])
    assert compiled["losses"] == pytest.approx(eager["losses"], abs=1e-5)
    assert compiled["eval"] == pytest.approx(eager["eval"], abs=1e-5)


def test_t5_errors_name_the_option(tmp_path):
    from epochal.train.inputs.loaders import build_data

    cfg = W.config(str(tmp_path / "run"), ["--data.vocab_extra_ids=0"])
    with pytest.raises(ConfigError) as err:
        build_data(cfg)
    assert err.value.option == "data.vocab_extra_ids" and "sentinel" in str(err.value)
    cfg = W.config(str(tmp_path / "run"), ["--data.seq_length_decoder=4"])
    with pytest.raises(ConfigError, match="seq_length_decoder=4 is too short"):
        build_data(cfg)
    with pytest.raises(ConfigError) as err:
        W.config(str(tmp_path / "run"), ["--model.max_position_embeddings=20"])
    assert err.value.option == "model.max_position_embeddings"
    assert "seq_length_decoder" in str(err.value)
