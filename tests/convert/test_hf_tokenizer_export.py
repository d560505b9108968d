"""``epochal convert --to hf`` ships the run's tokenizer so that ``AutoTokenizer`` has the
special tokens of ``config.json`` (issue 15, item 15), checked with the real ``transformers``."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main
from epochal.data.indexed.tokenizer import HuggingFaceTokenizer
from epochal.formats.common import ConversionError
from epochal.formats.hf.tokenizer import hf_tokenizer_files
from epochal.train.config import config_from_dict, model_config_from_section, to_toml
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.model_state import ModelState
from tests.convert.hf_models import ours

SPECIALS = ["<pad>", "<s>", "<|endoftext|>"]
TEXTS = ["def f(x):\n    return x + 1\n", "the quick brown fox jumps over the lazy dog"] * 20


def bpe_tokenizer_json(path, specials=SPECIALS):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXTS, trainer)
    tok.save(str(path))
    return path


def run_with_hf_tokenizer(tmp_path, specials=SPECIALS):
    tok_file = bpe_tokenizer_json(tmp_path / "tok.json", specials)
    vocab = HuggingFaceTokenizer(tok_file).vocab_size
    cfg = config_from_dict(
        {
            "run_dir": str(tmp_path / "run"),
            "data": {
                "data_path": ["/nonexistent/prefix"],
                "tokenizer_type": "HuggingFaceTokenizer",
                "tokenizer_model": str(tok_file),
                "seq_length": 32,
            },
            "model": {
                "hidden_size": 32,
                "num_layers": 2,
                "num_attention_heads": 4,
                "position_embedding_type": "rope",
                "normalization": "RMSNorm",
                "activation": "swiglu",
                "ffn_hidden_size": 64,
                "add_bias_linear": False,
            },
        }
    )
    model = ours(model_config_from_section(cfg.model, vocab_size=vocab, seq_length=32), seed=2)
    Checkpointer(tmp_path / "run" / "checkpoints").save(
        3,
        {"model": ModelState([model])},
        trainer_state={"format": 1, "step": 3},
        rng_state={"cpu": torch.get_rng_state()},
        config_toml=to_toml(cfg),
    )
    return tok_file


@pytest.mark.parametrize("specials", [SPECIALS, ["<|endoftext|>"]], ids=["bos+pad", "eos-only"])
def test_autotokenizer_matches_config_json(tmp_path, specials):
    transformers = pytest.importorskip("transformers")
    tok_file = run_with_hf_tokenizer(tmp_path, specials)
    out = tmp_path / "hf"
    assert main(["convert", str(tmp_path / "run"), str(out), "--to", "hf"]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ours_tok = HuggingFaceTokenizer(tok_file)
    assert config["eos_token_id"] == ours_tok.eod == hf_tok.eos_token_id
    assert hf_tok.eos_token == "<|endoftext|>"
    assert config["bos_token_id"] == ours_tok.bos == hf_tok.bos_token_id
    assert (hf_tok.bos_token is None) == ("<s>" not in specials)
    # pad: the tokenizer's own pad token, else eos (so batched HF generation works)
    expected_pad = ours_tok.pad if ours_tok.pad is not None else ours_tok.eod
    assert config["pad_token_id"] == expected_pad == hf_tok.pad_token_id
    assert hf_tok.pad_token == ("<pad>" if "<pad>" in specials else "<|endoftext|>")
    assert hf_tok.model_max_length == 32
    text = TEXTS[0]
    assert hf_tok(text)["input_ids"] == ours_tok.encode(text)  # no BOS/EOS added
    assert hf_tok.decode(ours_tok.encode(text)) == text


def test_explicit_ids_and_errors(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    tok_file = run_with_hf_tokenizer(tmp_path)
    out = tmp_path / "hf"
    assert (
        main(["convert", str(tmp_path / "run"), str(out), "--to", "hf", "--pad-token-id", "1"]) == 0
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.pad_token_id == 1 == json.loads((out / "config.json").read_text())["pad_token_id"]
    with pytest.raises(ConversionError, match=r"tok\.json: eos_token_id 99999"):
        hf_tokenizer_files(
            tok_file, bos_token_id=None, eos_token_id=99999, pad_token_id=None, model_max_length=8
        )
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConversionError, match="bad.json"):
        hf_tokenizer_files(
            bad, bos_token_id=None, eos_token_id=0, pad_token_id=None, model_max_length=8
        )
    # an id outside the tokenizer: a message, exit 2, no half-written folder
    assert (
        main(
            [
                "convert",
                str(tmp_path / "run"),
                str(tmp_path / "hf2"),
                "--to",
                "hf",
                "--eos-token-id",
                "99999",
            ]
        )
        == 2
    )
    assert "99999" in capsys.readouterr().err and not (tmp_path / "hf2").exists()
