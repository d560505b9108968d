"""BERT training on Megatron's data path: sentence-split indexed files, WordPiece, build_bert_datasets."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest

from epochal.data.indexed.preprocess import preprocess_documents
from epochal.data.indexed.tokenizer import build_tokenizer
from epochal.data.indexed.tokenizer_wordpiece import train_wordpiece
from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.data import build_data
from epochal.train.metrics import read_metrics
from epochal.train.trainer import Trainer

WORDS = "the cat dog sat on a mat and ran to house with big small red blue tree under over".split()
MODEL = [
    "--model.type=bert",
    "--model.activation=gelu",
    "--model.normalization=LayerNorm",
    "--model.position_embedding_type=learned_absolute",
    "--model.num_tokentypes=2",
    "--model.bert_binary_head=true",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=4",
    "--model.add_bias_linear=true",
    "--model.ffn_hidden_size=64",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A sentence-split corpus (documents of 2-6 sentences) and its offline WordPiece vocabulary."""
    d = tmp_path_factory.mktemp("bert_corpus")
    rng = random.Random(0)
    docs = [
        [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
            for _ in range(rng.randint(2, 6))
        ]
        for _ in range(200)
    ]
    train_wordpiece([" ".join(doc) for doc in docs], 120, d / "vocab.txt")
    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(d / "vocab.txt"))
    preprocess_documents(docs, tok, d / "corpus", append_eod=False)
    return d


def config(corpus, run_dir, *extra):
    return build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={run_dir}",
            "--data.corpus=",
            f"--data.data_path=['{corpus / 'corpus'}']",
            "--data.split=90,10,0",
            "--data.tokenizer_type=BertWordPieceLowerCase",
            f"--data.vocab_file={corpus / 'vocab.txt'}",
            f"--data.cache_dir={corpus / 'cache'}",
            "--data.seq_length=32",
            *MODEL,
            "--training.micro_batch_size=4",
            "--training.global_batch_size=8",
            "--training.train_iters=4",
            "--training.eval_interval=2",
            "--training.eval_iters=1",
            "--scheduler.lr_warmup_iters=1",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            *extra,
        ],
    )


def test_bert_trains_on_megatron_samples_and_logs_lm_and_sop_losses(corpus, tmp_path):
    tr = Trainer(config(corpus, tmp_path), log=False)
    result = tr.train()
    assert result.final_step == 4
    recs = read_metrics(tmp_path / "metrics.jsonl")
    trains = [r for r in recs if r["kind"] == "train"]
    for r in trains:  # the step loss is the masked-LM loss plus the binary head's
        assert r["loss"] == pytest.approx(r["lm loss"] + r["sop loss"], rel=1e-5)
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:
        assert 0.0 <= r["mlm accuracy"] <= 1.0
        assert r["mlm ppl"] == pytest.approx(math.exp(r["lm loss"]), rel=1e-6)


def test_runs_are_deterministic_per_seed(corpus, tmp_path):
    a = Trainer(config(corpus, tmp_path / "a"), log=False).train().losses
    b = Trainer(config(corpus, tmp_path / "b"), log=False).train().losses
    c = Trainer(config(corpus, tmp_path / "c", "--training.seed=7"), log=False).train().losses
    assert a == b and a != c


def test_errors(corpus, tmp_path):
    no_files = build_config(
        preset="tiny",
        overrides=[f"--run_dir={tmp_path}", "--data.corpus=", "--data.mock=true", *MODEL],
    )
    with pytest.raises(ConfigError, match="data.data_path"):
        build_data(no_files)
    unsplit = build_config(preset="tiny", overrides=[f"--run_dir={tmp_path}", *MODEL])
    with pytest.raises(ConfigError, match="data.split_sentences"):
        build_data(unsplit)
    with pytest.raises(ConfigError, match="data.wordpiece_vocab_size"):
        build_config(preset="tiny", overrides=["--data.wordpiece_vocab_size=1000"])
    esm = build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={tmp_path}",
            "--model.type=esm",
            "--model.activation=gelu",
            "--model.normalization=LayerNorm",
        ],
    )
    with pytest.raises(ConfigError, match="model.type"):
        build_data(esm)


def test_fill_mask_from_the_run_and_from_its_hf_export(corpus, tmp_path, capsys):
    from epochal.cli import main

    run = tmp_path / "run"
    Trainer(config(corpus, run, "--training.train_iters=2"), log=False).train()
    text = "the cat sat on the [MASK] ."
    out_file = tmp_path / "preds.jsonl"
    assert (
        main(
            [
                "fill-mask",
                "--checkpoint",
                str(run),
                "--text",
                text,
                "--top-k",
                "3",
                "--output",
                str(out_file),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"=== {text}" in printed and "[MASK] 0:" in printed
    (record,) = [json.loads(line) for line in out_file.read_text().splitlines()]
    (preds,) = record["predictions"]
    assert len(preds) == 3 and preds[0][1] >= preds[1][1] >= preds[2][1] > 0
    hf = tmp_path / "hf"
    assert main(["convert", "--from", "epochal", "--to", "hf", str(run), str(hf)]) == 0
    shutil.copy(corpus / "vocab.txt", hf / "vocab.txt")  # as Hugging Face BERT folders have
    out_hf = tmp_path / "preds_hf.jsonl"
    assert (
        main(
            [
                "fill-mask",
                "--checkpoint",
                str(hf),
                "--text",
                text,
                "--top-k",
                "3",
                "--output",
                str(out_hf),
            ]
        )
        == 0
    )
    (record_hf,) = [json.loads(line) for line in out_hf.read_text().splitlines()]
    assert [p[0] for p in record_hf["predictions"][0]] == [p[0] for p in preds]
    for (_, a), (_, b) in zip(record_hf["predictions"][0], preds):
        assert a == pytest.approx(b, abs=1e-5)
    with pytest.raises(ValueError, match="no mask token"):
        main(["fill-mask", "--checkpoint", str(run), "--text", "no mask here"])


def test_bert_tiny_preset_from_the_stdlib_resumes_exactly_and_fills_masks(
    tmp_path, monkeypatch, capsys
):
    """``epochal train --preset bert-tiny`` (shrunk): sentence-split stdlib, offline WordPiece."""
    from epochal.cli import main

    monkeypatch.setenv("EPOCHAL_CACHE", str(tmp_path / "cache"))
    small = [
        "--preset=bert-tiny",
        "--data.corpus_max_bytes=600000",
        "--data.wordpiece_vocab_size=1000",
        "--data.seq_length=64",
        "--model.hidden_size=32",
        "--model.num_layers=2",
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
    assert (
        main(
            [
                "train",
                *small,
                f"--run_dir={parts}",
                "--training.train_iters=4",
                "--scheduler.lr_decay_iters=4",
                "--training.train_iters=2",
            ]
        )
        == 0
    )
    assert main(["train", *small, f"--run_dir={parts}", "--training.train_iters=4"]) == 0
    vocab = list((tmp_path / "cache").glob("corpus-*/vocab.txt"))
    assert len(vocab) == 1 and "[MASK]" in vocab[0].read_text().split()
    loss = {}
    for run in (full, parts):
        recs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
        loss[run] = {r["step"]: r["loss"] for r in recs}
        assert all("sop loss" in r and "lm loss" in r for r in recs)
    assert loss[parts] == loss[full]  # steps 3-4 after the resume, bit for bit
    capsys.readouterr()
    assert main(["fill-mask", "--checkpoint", str(full), "--text", "import [MASK]"]) == 0
    assert "[MASK] 0:" in capsys.readouterr().out


def test_compiled_bert_equals_eager(tmp_path):
    """``training.compile`` (each block compiled) gives the eager losses (pairs, post-LN, padding)."""
    from tests.parallel import bert_worker as W

    eager = W.single(str(tmp_path / "eager"), W.PAIRS)
    compiled = W.single(str(tmp_path / "compiled"), [*W.PAIRS, "--training.compile=true"])
    assert compiled["losses"] == pytest.approx(eager["losses"], abs=1e-5)
    assert compiled["eval"] == pytest.approx(eager["eval"], abs=1e-5)
