"""``epochal preprocess`` records its tokenizer; ``train`` and ``generate`` use it or refuse another."""

from __future__ import annotations

import json
import os
import re
import shutil
import tomllib
from types import SimpleNamespace

import pytest

from epochal.cli import main as cli_main
from epochal.data.indexed.preprocess import preprocess
from epochal.data.indexed.tokenizer import ByteLevelTokenizer, build_tokenizer
from epochal.data.indexed.tokenizer_record import read_tokenizer_record
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


def _copy_corpus(prefix, to):
    """``to``'s ``.bin``/``.idx`` are ``prefix``'s (a corpus whose record a test breaks)."""
    for ext in (".bin", ".idx"):
        shutil.copyfile(f"{prefix}{ext}", f"{to}{ext}")
    return to


def _dangling(path):
    path.symlink_to(path.parent / "gone.json")


def _directory(path):
    path.mkdir()


def _fifo(path):
    os.mkfifo(path)


def _text(text):
    return lambda path: path.write_text(text)


def _fields(**changes):
    def write(path):
        record = json.loads((_RECORDED[0]).read_text())
        record.update(changes)
        path.write_text(json.dumps(record))

    return write


_RECORDED: list = []  # the good record of the module's corpus (set by the fixture below)
BROKEN = {
    "dangling link": (_dangling, "a symbolic link to .*gone.json, which does not exist"),
    "directory": (_directory, "a directory, not a tokenizer record file"),
    "fifo": (_fifo, "not a regular file"),
    "empty": (_text(""), "empty, not a tokenizer record"),
    "blank": (_text(" \n"), "empty, not a tokenizer record"),
    "truncated": (_text('{"format": 1, "tokenizer_type": "Byte'), "not valid JSON"),
    "not utf-8": (lambda path: path.write_bytes(b'{"format": \xff}'), "not valid JSON"),
    "a list": (_text("[1, 2]"), "a JSON list, not an object"),
    "a string": (_text('"ByteLevelTokenizer"'), "a JSON str, not an object"),
    "no fingerprint": (_fields(fingerprint=None), "fingerprint None is not a SHA-256"),
    "short fingerprint": (_fields(fingerprint="3b5d"), "fingerprint '3b5d' is not a SHA-256"),
    "unknown type": (_fields(tokenizer_type="Bogus"), "tokenizer_type 'Bogus' is not a tokenizer"),
    "type not a string": (_fields(tokenizer_type=5), "tokenizer_type 5 is not a tokenizer"),
    "vocab_size a string": (_fields(vocab_size="259"), "vocab_size '259' is not a positive"),
    "vocab_size a bool": (_fields(vocab_size=True), "vocab_size True is not a positive"),
    "eod beyond": (_fields(eod=259), "eod 259 is not an id below vocab_size 259"),
    "file a number": (_fields(vocab_file=3), "vocab_file 3 is not a string or null"),
    "extra ids negative": (_fields(vocab_extra_ids=-1), "vocab_extra_ids -1 is not a non-neg"),
    "newer format": (_fields(format=2), "tokenizer record format 2; this epochal reads 1"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_record_that_exists_but_is_no_record_is_an_error_naming_it(corpus, tmp_path, case):
    """Never "no record" (GPT-2's tokenizer on a bytes corpus): an error naming the file."""
    root, _, prefix = corpus
    _RECORDED[:] = [root / "c_text_document.tokenizer.json"]
    broken = _copy_corpus(prefix, tmp_path / "b_text_document")
    make, why = BROKEN[case]
    record = tmp_path / "b_text_document.tokenizer.json"
    make(record)
    cfg = _config(tmp_path, broken)
    with pytest.raises(ConfigError) as caught:
        build_data(cfg)
    message = str(caught.value)
    assert message.startswith(f"data.data_path: {record}: ")
    assert re.search(why, message), message
    fix = "preprocessing the corpus again" if case != "newer format" else "preprocess the corpus"
    assert fix in message


def test_a_corpus_without_a_record_name_is_still_read_as_before(corpus, tmp_path):
    root, _, prefix = corpus
    plain = _copy_corpus(prefix, tmp_path / "p_text_document")
    assert read_tokenizer_record(plain) is None
    assert read_tokenizer_record(root / "c_text_document")["tokenizer_type"] == "ByteLevelTokenizer"


def _word_level(path, words):
    """A Hugging Face tokenizer.json: ``words`` get ids 2, 3, ... in order."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"<|endoftext|>": 0, "[UNK]": 1} | {w: i + 2 for i, w in enumerate(words)}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(path))
    return path


def test_a_mismatch_of_look_alike_tokenizers_says_what_differs(corpus, tmp_path):
    """Same type, size and end-of-document id, other ids: the message shows the fingerprints
    and the files, and says what differs and what to do."""
    _, docs, _ = corpus
    words = ["The", "quick", "brown", "fox", "document", "some", "text"]
    a = _word_level(tmp_path / "a.json", words)
    b = _word_level(tmp_path / "b.json", [words[1], words[0], *words[2:]])  # two ids swapped
    ids = {}
    for name, tok in (("a", a), ("b", b)):
        args = ["preprocess", "--input", str(docs), "--tokenizer-type", "hf"]
        args += ["--tokenizer-model", str(tok), "--output-prefix", str(tmp_path / name)]
        assert cli_main([*args, "--no-progress"]) == 0
        ids[name] = json.loads((tmp_path / f"{name}_text_document.tokenizer.json").read_text())
    fa, fb = ids["a"]["fingerprint"], ids["b"]["fingerprint"]
    assert fa != fb
    prefix_a = tmp_path / "a_text_document"
    extra = ["--data.tokenizer_type=hf", f"--data.tokenizer_model={b}"]
    with pytest.raises(ConfigError) as caught:
        build_data(_config(tmp_path, prefix_a, *extra))
    message = str(caught.value)
    assert message.startswith("data.tokenizer_type: ")
    assert f"HuggingFaceTokenizer ({a}), 9 ids, end-of-document id 0, fingerprint {fa[:12]}" in message  # fmt: skip
    assert f"given is HuggingFaceTokenizer ({b}), 9 ids, end-of-document id 0, fingerprint {fb[:12]}" in message  # fmt: skip
    assert "same type, vocabulary size and end-of-document id but give other ids" in message
    assert message.endswith(
        "leave data.tokenizer_type and its files unset to use the recorded one, or set "
        f"data.tokenizer_type='HuggingFaceTokenizer' data.tokenizer_model='{a}'"
    )
    # two corpora recorded with the look-alikes, mixed in one data_path
    both = f"--data.data_path=[{str(prefix_a)!r}, {str(tmp_path / 'b_text_document')!r}]"
    with pytest.raises(ConfigError) as caught:
        build_data(_config(tmp_path, prefix_a, both))
    message = str(caught.value)
    assert message.startswith("data.data_path: mixes corpora preprocessed with different")
    assert f"fingerprint {fa[:12]}" in message and f"fingerprint {fb[:12]}" in message
    assert f"({a} against {b})" in message and "preprocess them with one tokenizer" in message
