"""``data.corpus`` as a ``.txt`` file: documents between blank lines, the same tokens as JSONL."""

from __future__ import annotations

import json

import numpy as np
import pytest

from epochal.data import IndexedDataset
from epochal.model.config import ConfigError
from epochal.train.config import DataConfig, build_config
from epochal.train.inputs.corpus import prepare_corpus

TEXT = "First line.\nSecond line of the first.\n\n\n  \nSecond document.\n\nThird\n  indented\n"
DOCS = ["First line.\nSecond line of the first.", "Second document.", "Third\n  indented"]


def _prepare(path, cache):
    return prepare_corpus(DataConfig(corpus=str(path), bpe_vocab_size=300, cache_dir=str(cache)))


def test_blank_lines_separate_documents_and_tokens_equal_the_jsonl_corpus(tmp_path):
    txt = tmp_path / "notes.txt"
    txt.write_text(TEXT)
    jsonl = tmp_path / "notes.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    from_txt = _prepare(txt, tmp_path / "c")
    from_jsonl = _prepare(jsonl, tmp_path / "c")
    assert from_txt.documents == 3 and from_txt.tokens == from_jsonl.tokens
    a, b = IndexedDataset(from_txt.prefix), IndexedDataset(from_jsonl.prefix)
    assert len(a) == len(b) == 3
    for i in range(3):
        np.testing.assert_array_equal(a[i], b[i])
    assert from_txt.tokenizer.decode(a[2].tolist()[:-1]) == DOCS[2]  # line breaks kept
    assert _prepare(txt, tmp_path / "c").cached


def test_a_file_without_blank_lines_is_one_document(tmp_path):
    txt = tmp_path / "one.txt"
    txt.write_text("a\nb\nc\n" * 50)
    assert _prepare(txt, tmp_path / "c").documents == 1


def test_bad_text_files_are_named(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    with pytest.raises(ValueError, match=r"blank\.txt: no documents"):
        _prepare(blank, tmp_path / "c")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.txt: not UTF-8 text \(byte 3\)"):
        _prepare(latin, tmp_path / "c")
    with pytest.raises(ConfigError, match=r"\.jsonl or \.txt file"):
        _prepare(tmp_path / "missing.txt", tmp_path / "c")


def test_the_option_accepts_a_text_file(tmp_path):
    txt = tmp_path / "book.txt"
    txt.write_text(TEXT)
    config = build_config(preset="tiny", overrides=[f"--data.corpus={txt}"])
    assert config.data.corpus == str(txt)
