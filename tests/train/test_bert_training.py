"""BERT training on Megatron's data path: sentence-split indexed files, WordPiece, build_bert_datasets."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch

from epochal.data.indexed.preprocess import preprocess_documents
from epochal.data.indexed.tokenizer import build_tokenizer
from epochal.data.indexed.tokenizer_wordpiece import train_wordpiece
from epochal.model import ConfigError
from epochal.parallel.step_model import StepModel
from epochal.train.config import build_config
from epochal.train.inputs.loaders import build_data
from epochal.train.observe.metrics import read_metrics
from epochal.train.trainer import Trainer
from tests.train.synthetic import write_prose_jsonl

WORDS = "the cat dog sat on a mat and ran to house with big small red blue tree under over".split()
MODEL = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
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


def _write_corpus(d, *, seed: int, num_docs: int):
    """``num_docs`` documents of 2-6 sentences, their offline WordPiece vocabulary and corpus in ``d``."""
    rng = random.Random(seed)
    docs = [
        [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."
            for _ in range(rng.randint(2, 6))
        ]
        for _ in range(num_docs)
    ]
    train_wordpiece([" ".join(doc) for doc in docs], 120, d / "vocab.txt")
    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(d / "vocab.txt"))
    preprocess_documents(docs, tok, d / "corpus", append_eod=False)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A sentence-split corpus (documents of 2-6 sentences) and its offline WordPiece vocabulary."""
    d = tmp_path_factory.mktemp("bert_corpus")
    return _write_corpus(d, seed=0, num_docs=200)


def config(corpus, run_dir, *extra):
    return build_config(
        preset="tiny", overrides=[f"--run_dir={run_dir}", *config_args(corpus, *extra)]
    )


def config_args(corpus, *extra):
    """The overrides of :func:`config` (a tiny BERT on ``corpus``) without ``--run_dir``."""
    return [
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
    ]


def test_eval_logits_of_bert_are_the_masked_lm_logits(corpus, tmp_path):
    """A tuple output (the binary head's second): the logits are the language model's."""
    tr = Trainer(config(corpus, tmp_path), log=False)
    logits = tr.evaluate_logits()
    assert logits is not None and len(logits) == 2  # eval_iters=1: 8 samples, micro-batches of 4
    batches = [tr.step_batch(mb) for mb, _ in zip(tr.data.valid_loader, logits)]
    model = tr.model_parts[0].eval()
    raw = []

    def forward(*args, **kwargs):
        raw.append(model(*args, **kwargs))
        return raw[-1]

    for batch, got in zip(batches, logits):
        with torch.no_grad():
            tr.train_step_handler.forward_step(iter([batch]), StepModel(forward))
        assert isinstance(raw[-1], tuple)
        torch.testing.assert_close(got, raw[-1][0].float())
        assert got.shape[:2] == batch["labels"].shape


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
    with pytest.raises(ConfigError, match="data.corpus.*proteins"):
        build_data(esm)  # ESM trains on proteins (tests/train/test_esm_training.py)


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
    capsys.readouterr()
    assert main(["fill-mask", "--checkpoint", str(run), "--text", "no mask here"]) == 1
    assert "no mask token" in capsys.readouterr().err


def test_bert_tiny_preset_on_a_fixed_corpus_resumes_exactly_and_fills_masks(
    tmp_path, monkeypatch, capsys
):
    """``epochal train --preset bert-tiny`` (shrunk): a fixed sentence-split corpus, offline WordPiece."""
    from epochal.cli import main

    monkeypatch.setenv("EPOCHAL_CACHE", str(tmp_path / "cache"))
    small = [
        "--preset=bert-tiny",
        "--training.device=cpu",  # compared run to run on the CPU: the same with or without a GPU
        f"--data.corpus={write_prose_jsonl(tmp_path / 'prose.jsonl')}",  # not the stdlib: it differs per Python version
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


@pytest.mark.slow  # torch.compile of GPT blocks: tests/train/test_speed_levers.py
def test_compiled_bert_equals_eager(tmp_path):
    """``training.compile`` (each block compiled) gives the eager losses (pairs, post-LN, padding)."""
    from tests.parallel import bert_worker as W

    eager = W.single(str(tmp_path / "eager"), W.PAIRS)
    compiled = W.single(str(tmp_path / "compiled"), [*W.PAIRS, "--training.compile=true"])
    assert compiled["losses"] == pytest.approx(eager["losses"], abs=1e-5)
    assert compiled["eval"] == pytest.approx(eager["eval"], abs=1e-5)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """A sentence-split corpus of 16 documents (a few dozen samples per epoch) and its vocabulary."""
    d = tmp_path_factory.mktemp("bert_small_corpus")
    return _write_corpus(d, seed=1, num_docs=16)


def _epoch_records(run_dir):
    """Epoch records by epoch (a resume's repeat must equal the first), without the segment."""
    out = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == "epoch":
            r = {k: v for k, v in r.items() if k != "segment"}
            assert out.setdefault(r["epoch"], r) == r
    return out


def test_epochs_are_recorded_checked_and_resume_exactly(small_corpus, tmp_path, capsys):
    """Several epochs: per-step ``epoch``, one record per epoch start, the summary line, the plot."""
    from epochal.cli import main

    args = [
        "train",
        "--preset=tiny",
        *[a for a in config_args(small_corpus) if not a.startswith("--training.train_iters")],
        "--data.split=100,0,0",
        "--training.eval_iters=0",
        "--training.eval_interval=0",
        "--checkpoint.save_interval=3",
        "--checkpoint.keep_last=10",
    ]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert main([*args, f"--run_dir={full}", "--training.train_iters=12"]) == 0
    out_full = capsys.readouterr().out
    assert main([*args, f"--run_dir={parts}", "--training.train_iters=12"]) == 0
    # as after a kill following step 12: resume from step 6 (the index depends on train_iters,
    # so the run keeps it); the steps and epoch starts after 6 are recorded twice
    for late in ("step_0000009", "step_0000012"):
        shutil.rmtree(parts / "checkpoints" / late)
    (parts / "checkpoints" / "latest").write_text("step_0000006\n")
    capsys.readouterr()
    assert main([*args, f"--run_dir={parts}", "--training.train_iters=12"]) == 0
    out_parts = capsys.readouterr().out

    starts = _epoch_records(full)
    assert starts == _epoch_records(parts)
    per = starts[0]["samples_per_epoch"]
    assert 8 < per < 12 * 8 / 2  # several epochs in 12 steps of 8 samples
    assert sorted(starts) == list(range(-(-12 * 8 // per)))
    for k, r in starts.items():
        assert r["first_sample"] == k * per and len(r["spans"]) == 4
        assert (r["step"] - 1) * 8 <= k * per < r["step"] * 8
    # the evidence is real: orders differ, and earlier samples of the same sentences were compared
    assert len({r["order"] for r in starts.values()}) == len(starts)
    assert sum(r["repeats"] for r in starts.values()) > 0
    assert all(r["same_masks"] == 0 for r in starts.values())
    trains = [r for r in read_metrics(full / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["epoch"] for r in trains] == [8 * r["step"] / per for r in trains]
    line = f"{12 * 8 / per:.2f} epochs of {per} samples; sample order and masks differed in every epoch (checked at {len(starts) - 1} epoch starts"
    assert line in out_full and line in out_parts
    assert (full / "loss.png").stat().st_size > 10_000
    from epochal.train.observe.plot import epoch_marks

    marks = epoch_marks(read_metrics(parts / "metrics.jsonl"))
    assert marks == epoch_marks(read_metrics(full / "metrics.jsonl"))
    assert marks == [(k * per / 8, f"epoch {k + 1}") for k in sorted(starts)[1:]]


class MasksPerSentences:
    """A faulty BERT dataset whose masks depend on the sentences only (a run's first draw)."""

    def __init__(self, dataset):
        self.inner = dataset
        self.samples_per_epoch = dataset.samples_per_epoch

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, idx):
        first = self.inner.earlier_occurrences(idx, idx)
        return self.inner[int(first[0]) if len(first) else idx]

    def sample_span(self, idx):
        return self.inner.sample_span(idx)

    def earlier_occurrences(self, idx, before):
        return self.inner.earlier_occurrences(idx, before)


def test_epoch_summary_reports_what_repeats(small_corpus):
    """Fresh masks per index are seen; masks fixed per sentence run are reported as repeated."""
    from epochal.data.datasets.bert_builder import BERTDatasetConfig, build_bert_datasets
    from epochal.train.inputs.epoch_evidence import epoch_recorder, epoch_summary

    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(small_corpus / "vocab.txt"))
    cfg = BERTDatasetConfig(
        seq_length=32,
        seed=3,
        tokenizer=tok,
        split="100,0,0",
        data_path=[str(small_corpus / "corpus")],
    )
    train = build_bert_datasets(cfg, [200, 0, 0])[0]

    def records(dataset):
        rec = epoch_recorder(dataset, 4)
        assert rec.starts_between(0, rec.samples_per_epoch + 1) == range(2)
        out = [rec.record(k, k + 1) for k in range(len(train) // rec.samples_per_epoch)]
        out.append({"kind": "train", "step": 9, "epoch": 3.5})
        return out

    fresh, fixed = records(train), records(MasksPerSentences(train))
    repeats = [sum(r.get("repeats", 0) for r in recs) for recs in (fresh, fixed)]
    same = [sum(r.get("same_masks", 0) for r in recs) for recs in (fresh, fixed)]
    assert repeats[0] == repeats[1] > 0  # the same sentence runs compared
    assert same[1] == repeats[1] and same[0] < repeats[0] / 2  # (short samples: 1-2 masks)
    summary = epoch_summary(fixed)
    assert "masks repeated in epoch(s) [2, 3" in summary and "order repeated" not in summary
    assert "sample order and masks differed" not in summary
    assert epoch_summary([{"kind": "train", "step": 1, "loss": 1.0}]) is None
