"""`epochal train` end to end on tiny settings: corpus preparation, training, checkpoint, plot, summary."""

from __future__ import annotations

import json

import pytest

from epochal.cli import main as cli_main
from epochal.train.config import DataConfig
from epochal.train.inputs.corpus import prepare_corpus, stdlib_files

SMALL = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--model.hidden_size=32",
    "--model.num_layers=1",
    "--model.num_attention_heads=2",
    "--model.num_query_groups=1",
    "--model.ffn_hidden_size=64",
    "--data.seq_length=32",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.train_iters=6",
    "--training.eval_interval=3",
    "--training.eval_iters=1",
    # no warmup option: the preset's lr_warmup_fraction must fit a 6-step run (issue 15, item 7)
    "--checkpoint.save_interval=3",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def test_demo_pipeline_on_a_small_stdlib_subset(tmp_path, capsys):
    cache = tmp_path / "cache"
    args = [
        "train",
        f"--run_dir={tmp_path / 'run'}",
        f"--data.cache_dir={cache}",
        "--data.corpus_max_bytes=150000",
        "--data.bpe_vocab_size=512",
        "--data.split=90,10,0",
        *SMALL,
    ]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "training a 512-id BPE tokenizer" in out and "standard-library files" in out
    assert "trained steps 1-6" in out and "validation loss" in out
    run = tmp_path / "run"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000006"
    assert (run / "loss.png").is_file() and (run / "config.toml").is_file()
    assert f"plot: {run / 'loss.png'}" in out
    # A second run resumes, finds nothing to do, and the corpus comes from the cache.
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "nothing to do" in out and "(cached)" in out and "training a" not in out


def test_jsonl_corpus_and_cache_key(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(
        "".join(
            json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n" * 20}) + "\n"
            for i in range(40)
        )
    )
    cfg = DataConfig(corpus=str(corpus), bpe_vocab_size=300, cache_dir=str(tmp_path / "c"))
    first = prepare_corpus(cfg)
    assert not first.cached and first.documents == 40 and first.tokenizer.vocab_size == 300
    again = prepare_corpus(cfg)
    assert again.cached and again.prefix == first.prefix and again.tokens == first.tokens
    corpus.write_text(corpus.read_text() + json.dumps({"text": "x = 1\n"}) + "\n")
    assert prepare_corpus(cfg).prefix != first.prefix  # content is part of the key
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        prepare_corpus(
            DataConfig(corpus=str(bad), bpe_vocab_size=300, cache_dir=str(tmp_path / "c"))
        )


def test_stdlib_subset_is_deterministic():
    a, b = stdlib_files(300_000), stdlib_files(300_000)
    assert a == b and len(a) >= 2
    assert all("test" not in p.parts for p in a)


def test_cli_errors_and_print_config(tmp_path, capsys):
    assert cli_main(["train", "--optimizer.lr=-1"]) == 2
    assert "optimizer.lr" in capsys.readouterr().err
    assert cli_main(["train", "--config", str(tmp_path / "none.toml")]) == 2
    assert "none.toml" in capsys.readouterr().err
    assert cli_main(["train", "--print-config", "--training.train_iters=77"]) == 0
    assert "train_iters = 77" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["train", "--bogus"])
    assert (
        cli_main(
            [
                "train",
                "--data.corpus=",
                f"--data.data_path=['{tmp_path / 'missing'}']",
                "--data.tokenizer_type=bytes",
                f"--run_dir={tmp_path / 'r'}",
                *SMALL,
            ]
        )
        == 2
    )
    assert "data.data_path: " in capsys.readouterr().err
