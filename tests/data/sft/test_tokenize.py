"""Tokenization errors and counts: templates, length limits, options (no TRL needed)."""

from __future__ import annotations

import pytest

from epochal.data.sft import (
    SFTDataError,
    has_generation_markers,
    load_chat_tokenizer,
    rows_from_records,
    tokenize_sft_rows,
)
from tests.data.sft.tiny_chat import (
    MESSAGES_ROWS,
    PLAIN_TEMPLATE,
    PROMPT_COMPLETION_ROWS,
    TEMPLATE,
    tiny_chat_tokenizer,
)

pytest.importorskip("transformers")


def _rows(records, source="chat.jsonl"):
    return rows_from_records([(i + 1, r) for i, r in enumerate(records)], source=source)


def test_generation_markers_are_found_in_every_trim_form():
    assert has_generation_markers(TEMPLATE)
    assert has_generation_markers("{%- generation -%}x{%- endgeneration %}")
    assert has_generation_markers({"default": TEMPLATE, "tool_use": PLAIN_TEMPLATE})
    assert not has_generation_markers(PLAIN_TEMPLATE)
    assert not has_generation_markers(None)


def test_without_generation_markers_assistant_turns_come_from_rendered_prefixes():
    """The same template without markers: the same masks, found by rendering, and reported."""
    plain = tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer(PLAIN_TEMPLATE))
    marked = tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer())
    assert [e.input_ids.tolist() for e in plain] == [e.input_ids.tolist() for e in marked]
    assert [e.loss_mask.tolist() for e in plain] == [e.loss_mask.tolist() for e in marked]
    assert not all(e.loss_mask.all() for e in plain)
    assert plain.report.prefix_masked == 3 and marked.report.prefix_masked == 0
    assert "assistant turns of 3 rows found by rendering prefixes" in plain.report.summary()


def test_a_template_that_renders_earlier_turns_differently_is_an_error():
    """A template whose last turn differs from earlier ones (no prefix): error, names the row."""
    template = PLAIN_TEMPLATE.replace(
        "{{ message['content'] }}<|eot|>",
        "{{ message['content'] }}{% if loop.last %}<|eot|>{% endif %}",
    )
    with pytest.raises(SFTDataError) as info:
        tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer(template))
    text = str(info.value)
    # row 0 ends on its only assistant turn; row 1's first one is not rendered as later
    assert text.startswith("chat.jsonl row 1 (line 2): the chat template has no {% generation %}")
    assert "messages[1] does not render as the start of the whole" in text
    assert "loss_on to 'all'" in text
    assert (
        len(tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer(template), loss_on="all"))
        == 3
    )


def test_a_template_that_does_not_render_names_the_row():
    template = (
        "{% for m in messages %}{% if m['content'] == 'hello' %}"
        "{{ raise_exception('no greetings') }}{% endif %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(SFTDataError, match=r"chat\.jsonl row 2 \(line 3\): the chat template does "
                       r"not render this row \(TemplateError: no greetings\)"):  # fmt: skip
        tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer(template), loss_on="all")
    with pytest.raises(SFTDataError, match=r"row 0 \(line 1\): a conversational row needs a "
                       "tokenizer with a chat template"):  # fmt: skip
        tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer(None))


def test_a_conversation_without_assistant_turn_is_an_error_for_assistant_loss():
    rows = _rows([{"messages": [{"role": "user", "content": "hello"}]}])
    with pytest.raises(
        SFTDataError, match=r"row 0 \(line 1\): the chat template marks no assistant"
    ):
        tokenize_sft_rows(rows, tiny_chat_tokenizer())
    assert len(tokenize_sft_rows(rows, tiny_chat_tokenizer(), loss_on="all")) == 1


def test_rows_over_the_length_limit_error_skip_or_truncate_and_are_counted():
    tokenizer = tiny_chat_tokenizer()
    rows = _rows(PROMPT_COMPLETION_ROWS)
    lengths = [len(e) for e in tokenize_sft_rows(rows, tokenizer)]
    limit = sorted(lengths)[1]  # two rows fit, two do not
    over = [i for i, n in enumerate(lengths) if n > limit]
    with pytest.raises(SFTDataError) as info:
        tokenize_sft_rows(rows, tokenizer, max_length=limit)
    assert str(info.value).startswith(
        f"chat.jsonl row {over[0]} (line {over[0] + 1}): {lengths[over[0]]} tokens, over the "
        f"length limit of {limit}"
    )
    skipped = tokenize_sft_rows(rows, tokenizer, max_length=limit, overlength="skip")
    assert [e.index for e in skipped] == [i for i in range(4) if i not in over]
    report = skipped.report
    assert (report.rows, report.examples, report.skipped, report.truncated) == (4, 2, 2, 0)
    assert f"2 over {limit} tokens skipped" in report.summary()
    cut = tokenize_sft_rows(rows, tokenizer, max_length=limit, overlength="truncate")
    assert [len(e) for e in cut] == [min(n, limit) for n in lengths]
    assert [e.truncated for e in cut] == [max(n - limit, 0) for n in lengths]
    assert cut.report.truncated == 2
    assert cut.report.truncated_tokens == sum(n - limit for n in lengths if n > limit)
    assert cut.report.tokens == sum(min(n, limit) for n in lengths)
    assert cut.report.loss_tokens == sum(int(e.loss_mask[1:].sum()) for e in cut)


def test_invalid_options_name_the_option():
    rows = _rows(PROMPT_COMPLETION_ROWS)
    with pytest.raises(ValueError, match="loss_on must be one of completion, all, got 'assistant'"):
        tokenize_sft_rows(rows, tiny_chat_tokenizer(), loss_on="assistant")
    with pytest.raises(ValueError, match="overlength must be one of error, skip, truncate"):
        tokenize_sft_rows(rows, tiny_chat_tokenizer(), overlength="drop")
    with pytest.raises(ValueError, match="max_length must be a positive int"):
        tokenize_sft_rows(rows, tiny_chat_tokenizer(), max_length=0)


def test_a_completion_already_ending_with_eos_gets_no_second_one():
    tokenizer = tiny_chat_tokenizer()
    plain = tokenize_sft_rows(_rows([{"prompt": "hi", "completion": " you"}]), tokenizer)
    ended = tokenize_sft_rows(_rows([{"prompt": "hi", "completion": " you</s>"}]), tokenizer)
    assert plain[0].input_ids.tolist() == ended[0].input_ids.tolist()
    assert plain[0].input_ids[-1] == tokenizer.eos_token_id
    assert plain[0].input_ids[0] == tokenizer.bos_token_id  # the tokenizer's own BOS


def test_load_chat_tokenizer_reads_a_saved_folder_with_its_template(tmp_path):
    tiny_chat_tokenizer().save_pretrained(tmp_path / "tok")
    loaded = load_chat_tokenizer(tmp_path / "tok")
    assert loaded.chat_template == TEMPLATE
    ours = tokenize_sft_rows(_rows(MESSAGES_ROWS), loaded)
    again = tokenize_sft_rows(_rows(MESSAGES_ROWS), tiny_chat_tokenizer())
    assert [e.loss_mask.tolist() for e in ours] == [e.loss_mask.tolist() for e in again]
    with pytest.raises(SFTDataError, match="no loadable tokenizer"):
        load_chat_tokenizer(tmp_path / "empty")
