"""WordPiece vocabularies without ordinary tokens and absurd sentinel counts (issue 26): clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from epochal.data.indexed.tokenizer import TokenizerFileError, build_tokenizer
from epochal.data.indexed.tokenizer_wordpiece import MAX_VOCAB_EXTRA_IDS, BertWordPieceTokenizer
from epochal.model.config import ConfigError
from epochal.train.config import build_config

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(tmp_path, tokens, name="vocab.txt"):
    path = tmp_path / name
    path.write_text("".join(f"{t}\n" for t in tokens))
    return path


@pytest.mark.parametrize(
    "extra", [[], ["[unused0]", "[unused1]", "[BOS]", "[EOS]", "<extra_id_0>"]]
)
def test_a_vocabulary_of_special_tokens_only_is_refused_naming_the_file(tmp_path, extra):
    path = _vocab(tmp_path, SPECIALS + extra)
    with pytest.raises(
        TokenizerFileError, match=rf"{path}: the BERT vocabulary holds only special"
    ):
        BertWordPieceTokenizer(path)
    # one ordinary token is enough
    assert BertWordPieceTokenizer(_vocab(tmp_path, [*SPECIALS, *extra, "hello"], "ok.txt")).encode(
        "hello"
    )


def test_vocab_extra_ids_has_an_upper_bound(tmp_path):
    path = _vocab(tmp_path, [*SPECIALS, "hello"])
    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=path, vocab_extra_ids=100)
    assert tok.additional_special_tokens[-1] == "<extra_id_99>"
    with pytest.raises(ValueError, match=r"--vocab-extra-ids.*100,000.*got 100,000,000"):
        build_tokenizer("BertWordPieceLowerCase", vocab_file=path, vocab_extra_ids=10**8)
    with pytest.raises(ConfigError, match="data.vocab_extra_ids"):
        build_config(
            preset="t5-tiny", overrides=[f"--data.vocab_extra_ids={MAX_VOCAB_EXTRA_IDS + 1}"]
        )


def test_preprocess_refuses_both_quickly(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text": "hello world"}) + "\n")
    good, bad = _vocab(tmp_path, [*SPECIALS, "hello"], "good.txt"), _vocab(tmp_path, SPECIALS)
    base = [sys.executable, "-m", "epochal.cli", "preprocess", "--input", str(data)]
    base += ["--output-prefix", str(tmp_path / "out"), "--tokenizer-type", "BertWordPieceLowerCase"]
    for extra, expected in (
        (["--vocab-file", str(good), "--vocab-extra-ids", "100000000"], "--vocab-extra-ids"),
        (["--vocab-file", str(bad)], f"{bad}: the BERT vocabulary holds only special tokens"),
    ):
        out = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and expected in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
