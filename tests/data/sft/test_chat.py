"""Chat prompts and end-of-turn tokens for generation (:mod:`epochal.data.sft.chat`)."""

from __future__ import annotations

import pytest

from epochal.data.sft import (
    SFTDataError,
    chat_prompt_ids,
    chat_tokenizer_files,
    end_of_turn_ids,
    token_ids,
)
from epochal.data.sft.examples import TOKENIZER_DIR
from tests.data.sft.tiny_chat import TEMPLATE, tiny_chat_tokenizer

pytest.importorskip("transformers")

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }}"
    " [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
USER = [{"role": "user", "content": "hello"}]


def test_the_prompt_is_transformers_generation_prompt_rendering():
    tok = tiny_chat_tokenizer(TEMPLATE)
    want = tok.apply_chat_template(USER, add_generation_prompt=True, return_dict=True)
    assert chat_prompt_ids(tok, USER) == list(want["input_ids"])


@pytest.mark.parametrize(
    "template, llama3, turn_end",
    [(TEMPLATE, False, "<|eot|>"), (LLAMA3, True, "<|eot_id|>"), (MISTRAL, False, "</s>")],
)
def test_end_of_turn_is_eos_and_what_the_template_ends_a_reply_with(template, llama3, turn_end):
    tok = tiny_chat_tokenizer(template, llama3=llama3)
    reply = tok.apply_chat_template(
        [*USER, {"role": "assistant", "content": "x"}], return_dict=True
    )["input_ids"]
    stops = end_of_turn_ids(tok)
    assert stops[0] == tok.eos_token_id
    assert tok.convert_tokens_to_ids(turn_end) in stops
    assert reply[-1] in stops  # transformers ends the rendered reply's turn with one of them


def test_chatml_im_end_is_a_stop_token():
    tok = tiny_chat_tokenizer(CHATML)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # EOS, the extra ids, the template's, then the usual ones the vocabulary holds
    assert end_of_turn_ids(tok, extra=[7])[:3] == [tok.eos_token_id, 7, im_end]


def test_stop_strings_are_single_tokens():
    tok = tiny_chat_tokenizer()
    assert token_ids(tok, ["<|eot|>", "."]) == [
        tok.convert_tokens_to_ids("<|eot|>"),
        tok(".", add_special_tokens=False)["input_ids"][0],
    ]
    with pytest.raises(SFTDataError, match="--stop 'hello world'"):
        token_ids(tok, ["hello world"])


def test_bad_conversations_and_missing_templates_are_refused():
    with pytest.raises(SFTDataError, match="role must be one of"):
        chat_prompt_ids(tiny_chat_tokenizer(), [{"role": "robot", "content": "hi"}])
    with pytest.raises(SFTDataError, match="no chat template"):
        chat_prompt_ids(tiny_chat_tokenizer(None), USER)


def test_tokenizer_files_carry_a_jinja_template_into_tokenizer_config(tmp_path):
    import json

    for file in TOKENIZER_DIR.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    files = chat_tokenizer_files(tmp_path)
    assert json.loads(files["tokenizer_config.json"])["chat_template"] == template
    assert files["tokenizer.json"] == (TOKENIZER_DIR / "tokenizer.json").read_bytes()
    with pytest.raises(SFTDataError, match="not a Hugging Face tokenizer folder"):
        chat_tokenizer_files(tmp_path / "nothing")
