"""Tokenizer folders are loaded without running their code, and with a chat template that is text."""

from __future__ import annotations

import io
import json
import shutil
import sys

import pytest

from epochal.data.sft import SFTDataError, load_chat_tokenizer, read_sft_rows, tokenize_sft_rows
from epochal.data.sft.examples import TOKENIZER_DIR
from tests.data.sft.tiny_chat import MESSAGES_ROWS, tiny_chat_tokenizer

pytest.importorskip("transformers")

#: a tokenizer module that leaves a file behind when it is imported
CUSTOM_CODE = """
import pathlib
pathlib.Path(__file__).with_name("custom_code_ran").write_text("ran")
from transformers import PreTrainedTokenizerFast


class CustomTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _folder(tmp_path, **config):
    folder = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER_DIR, folder)
    path = folder / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return folder


@pytest.mark.parametrize(
    ("file", "entry", "value"),
    [
        ("tokenizer_config.json", "AutoTokenizer", [None, "custom_tokenizer.CustomTokenizer"]),
        ("tokenizer_config.json", None, ["custom_tokenizer.CustomTokenizer", None]),  # legacy
        ("config.json", "AutoConfig", "custom_tokenizer.CustomConfig"),
    ],
)
def test_custom_code_is_refused_naming_the_entry_and_file_even_when_answered_yes(
    tmp_path, monkeypatch, file, entry, value
):
    """``echo y |`` answers transformers' "run the custom code?" question: the folder's
    .py must still never run, and the error names the auto_map entry and the .py."""
    folder = _folder(tmp_path)
    (folder / "custom_tokenizer.py").write_text(CUSTOM_CODE)
    config_path = folder / file
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config["auto_map"] = value if entry is None else {entry: value}
    if file == "config.json":
        config.update(model_type="llama")
    config_path.write_text(json.dumps(config))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    with pytest.raises(SFTDataError) as info:
        load_chat_tokenizer(folder)
    assert not (folder / "custom_code_ran").exists()
    text = str(info.value)
    shown = "auto_map" if entry is None else f"auto_map.{entry}"
    assert text.startswith(f"{config_path}: {shown} = 'custom_tokenizer.Custom")
    assert str(folder / "custom_tokenizer.py") in text and "trust_remote_code=False" in text


def test_a_hub_reference_is_named_and_model_entries_are_left_alone(tmp_path):
    folder = _folder(tmp_path, auto_map={"AutoTokenizer": ["org/repo--tok.Tok", None]})
    with pytest.raises(SFTDataError, match="tok.py of the Hub repository org/repo"):
        load_chat_tokenizer(folder)
    folder = _folder(tmp_path / "model")
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "m.M"}})
    )
    assert load_chat_tokenizer(folder).chat_template  # a tokenizer needs no model code


@pytest.mark.parametrize("template", [5, ["{{ x }}"], {"default": 3}])
def test_a_chat_template_that_is_not_text_is_refused_naming_the_file(tmp_path, template):
    folder = _folder(tmp_path, chat_template=template)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(SFTDataError) as info:
        load_chat_tokenizer(folder)
    text = str(info.value)
    assert text.startswith(f'{folder / "tokenizer_config.json"}: "chat_template" must be a Jinja')
    assert f"got {type(template).__name__}" in text and "remove it" in text


def test_a_tokenizer_object_whose_template_is_not_text_is_an_sft_error(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(MESSAGES_ROWS[0]) + "\n")
    tokenizer = tiny_chat_tokenizer()
    tokenizer.chat_template = 5
    with pytest.raises(SFTDataError, match='the tokenizer: "chat_template" must be'):
        tokenize_sft_rows(read_sft_rows(path), tokenizer)
