"""``epochal preprocess`` records its tokenizer; ``train`` and ``generate`` use it or refuse another."""

from __future__ import annotations

import json
import tomllib
from types import SimpleNamespace

import pytest

from epochal.cli import main as cli_main
from epochal.data.indexed.preprocess import preprocess
from epochal.data.indexed.tokenizer import ByteLevelTokenizer, build_tokenizer
from epochal.model.config import ConfigError
from epochal.train.config import build_config, to_toml
from epochal.train.inputs.loaders import build_data
from epochal.train.inputs.recorded_tokenizer import with_resolved_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("recorded")
    docs = root / "docs.jsonl"
    docs.write_text(
        "".join(
            json.dumps({"text": f"document {i}: " + "some text. " * (3 + i % 5)}) + "\n"
            for i in range(60)
        )
    )
    args = ["preprocess", "--input", str(docs), "--tokenizer-type", "bytes", "--append-eod"]
    assert cli_main([*args, "--output-prefix", str(root / "c"), "--no-progress"]) == 0
    return root, docs, root / "c_text_document"


def _config(root, prefix, *extra):
    return build_config(
        preset=None,
        overrides=[
            f"--run_dir={root / 'run'}", "--data.corpus=", f"--data.data_path=[{str(prefix)!r}]",
            "--data.seq_length=32", f"--data.cache_dir={root / 'cache'}", "--training.train_iters=2",
            "--training.eval_iters=1", "--training.device=cpu", *extra,
        ],
    )  # fmt: skip


def test_the_record_sits_next_to_unchanged_megatron_files(corpus):
    root, docs, prefix = corpus
    record = json.loads((root / "c_text_document.tokenizer.json").read_text())
    assert record["tokenizer_type"] == "ByteLevelTokenizer"
    assert (record["vocab_size"], record["eod"]) == (259, 256)
    preprocess(docs, root / "plain", ByteLevelTokenizer(), append_eod=True)
    for ext in (".bin", ".idx"):  # byte for byte what preprocessing without a record writes
        assert (root / f"c_text_document{ext}").read_bytes() == (
            root / f"plain_text_document{ext}"
        ).read_bytes()


def test_train_takes_the_recorded_tokenizer_and_refuses_another(corpus, tmp_path, capsys):
    root, _, prefix = corpus
    cfg = _config(root, prefix)
    assert cfg.data.tokenizer_type == ""  # none given
    data = build_data(cfg)
    assert (type(data.tokenizer).__name__, data.vocab_size) == ("ByteLevelTokenizer", 259)
    assert with_resolved_tokenizer(cfg).data.tokenizer_type == "ByteLevelTokenizer"  # saved
    with pytest.raises(ConfigError, match=r"data\.tokenizer_type: .* ByteLevelTokenizer, 259 ids"):
        build_data(_config(root, prefix, "--data.tokenizer_type=GPT2BPETokenizer"))
    run = tmp_path / "run"
    args = ["train", "--data.tokenizer_type=gpt2", f"--run_dir={run}"]
    args += ["--data.corpus=", f"--data.data_path=[{str(prefix)!r}]", "--training.device=cpu"]
    assert cli_main(args) == 2  # refused before anything is prepared
    assert "error: data.tokenizer_type:" in capsys.readouterr().err and not run.exists()


def test_generate_uses_the_record_and_refuses_another(corpus):
    from epochal.commands.generate import _check_recorded_tokenizer
    from epochal.train.state.epochal_ckpt import tokenizer_for_run

    root, _, prefix = corpus
    cfg = _config(root, prefix)
    assert isinstance(tokenizer_for_run(cfg), ByteLevelTokenizer)
    run_config = tomllib.loads(to_toml(cfg))
    given = SimpleNamespace(run_config=run_config, tokenizer=build_tokenizer("gpt2"))
    with pytest.raises(ConfigError, match="--tokenizer-type: .*leave --tokenizer-type out"):
        _check_recorded_tokenizer(given)
    _check_recorded_tokenizer(
        SimpleNamespace(run_config=run_config, tokenizer=ByteLevelTokenizer())
    )


def test_data_without_a_record_reads_as_before(corpus, tmp_path):
    root, docs, _ = corpus
    preprocess(docs, tmp_path / "megatron", ByteLevelTokenizer(), append_eod=True)  # no record
    data = build_data(_config(tmp_path, tmp_path / "megatron_text_document"))
    assert type(data.tokenizer).__name__ == "GPT2BPETokenizer"  # Megatron's default, as before
