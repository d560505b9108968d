"""Peer tests: epochal's SFT token ids, loss masks and loss equal what TRL's SFTTrainer prepares.

The expected values come from TRL itself: an ``SFTTrainer`` is built on a tiny
``transformers`` Llama with the tiny chat tokenizer, and its prepared
``train_dataset`` (``input_ids`` and ``labels``, ``-100`` where no loss) and its
``evaluate()`` loss are compared with :func:`tokenize_sft_rows` and :func:`sft_loss`.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from epochal.data.sft import rows_from_records, sft_loss, shift_labels, tokenize_sft_rows
from tests.data.sft.tiny_chat import (
    CONVERSATIONAL_PC_ROWS,
    MESSAGES_ROWS,
    PROMPT_COMPLETION_ROWS,
    tiny_chat_tokenizer,
    tiny_llama,
)

pytestmark = pytest.mark.peer
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def _trainer(records, tmp_path, *, eval_records=None, tokenizer=None, **config):
    tokenizer = tokenizer or tiny_chat_tokenizer()
    model = tiny_llama(len(tokenizer))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's own deprecated-argument notices
        args = trl.SFTConfig(
            output_dir=str(tmp_path / "trl"),
            report_to=[],
            use_cpu=True,
            per_device_eval_batch_size=64,
            **config,
        )
        return trl.SFTTrainer(
            model=model,
            args=args,
            train_dataset=datasets.Dataset.from_list(records),
            eval_dataset=None if eval_records is None else datasets.Dataset.from_list(eval_records),
            processing_class=tokenizer,
        )


def _ours(records, tokenizer=None, **kwargs):
    rows = rows_from_records([(None, r) for r in records], source="rows.jsonl")
    return tokenize_sft_rows(rows, tokenizer or tiny_chat_tokenizer(), **kwargs)


def _assert_same(ours, trainer):
    prepared = trainer.train_dataset
    assert len(ours) == len(prepared)
    for example, theirs in zip(ours.examples, prepared):
        assert example.input_ids.tolist() == theirs["input_ids"]
        assert example.loss_mask.tolist() == [label != -100 for label in theirs["labels"]]


CASES = [
    # (rows, epochal loss_on, TRL config)
    (MESSAGES_ROWS, "completion", {"assistant_only_loss": True}),
    (MESSAGES_ROWS, "all", {}),
    (PROMPT_COMPLETION_ROWS, "completion", {}),
    (PROMPT_COMPLETION_ROWS, "all", {"completion_only_loss": False}),
    (CONVERSATIONAL_PC_ROWS, "completion", {}),
    (CONVERSATIONAL_PC_ROWS, "all", {"completion_only_loss": False}),
]
IDS = ["messages", "messages-all", "prompt-completion", "prompt-completion-all",
       "conversational-pc", "conversational-pc-all"]  # fmt: skip


@pytest.mark.parametrize(("records", "loss_on", "config"), CASES, ids=IDS)
def test_ids_and_loss_masks_equal_trl(records, loss_on, config, tmp_path):
    ours = _ours(records, max_length=128, loss_on=loss_on)
    trainer = _trainer(records, tmp_path, max_length=128, **config)
    _assert_same(ours, trainer)
    assert any(not e.loss_mask.all() for e in ours.examples) == (loss_on == "completion")


def test_truncation_equals_trl_keep_start_and_is_counted(tmp_path):
    """Rows cut to max_length as TRL cuts them; a row left without loss tokens is dropped."""
    ours = _ours(MESSAGES_ROWS, max_length=40, loss_on="completion", overlength="truncate")
    trainer = _trainer(MESSAGES_ROWS, tmp_path, max_length=40, assistant_only_loss=True)
    _assert_same(ours, trainer)
    report = ours.report
    full = [len(e) for e in _ours(MESSAGES_ROWS, loss_on="completion").examples]
    assert report.truncated == sum(n > 40 for n in full) == 2
    assert report.truncated_tokens == sum(n - 40 for n in full if n > 40)
    assert report.dropped_no_loss == 1 and report.examples == len(trainer.train_dataset) == 2
    assert "truncated to 40 tokens" in report.summary()


def test_llama3_template_without_markers_gives_trl_training_template_masks(tmp_path):
    """Llama 3's own template has no generation markers: TRL swaps in its marked training
    copy, epochal renders prefixes; the ids and assistant masks are the same."""
    from trl.chat_template_utils import has_generation_markers, llama3_chat_template

    assert not has_generation_markers(llama3_chat_template)
    ours = _ours(
        MESSAGES_ROWS, tiny_chat_tokenizer(llama3_chat_template, llama3=True), max_length=128
    )
    assert ours.report.prefix_masked == len(MESSAGES_ROWS)
    trainer = _trainer(
        MESSAGES_ROWS,
        tmp_path,
        tokenizer=tiny_chat_tokenizer(llama3_chat_template, llama3=True),
        max_length=128,
        assistant_only_loss=True,
    )
    assert has_generation_markers(trainer.chat_template)  # TRL's training copy
    _assert_same(ours, trainer)
    assert not all(e.loss_mask.all() for e in ours.examples)


@pytest.mark.parametrize(("records", "loss_on", "config"), CASES[::2], ids=IDS[::2])
def test_token_mean_loss_equals_trl_evaluate(records, loss_on, config, tmp_path):
    """TRL's eval loss (transformers' token mean over the set, one batch) equals sft_loss."""
    trainer = _trainer(records, tmp_path, eval_records=records, max_length=128, **config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = trainer.evaluate()["eval_loss"]
    ours = _ours(records, max_length=128, loss_on=loss_on)
    model = trainer.model
    width = max(len(e) for e in ours.examples)
    ids = torch.zeros(len(ours), width, dtype=torch.long)
    mask = torch.zeros(len(ours), width, dtype=torch.bool)
    for i, example in enumerate(ours.examples):
        ids[i, : len(example)] = torch.from_numpy(example.input_ids)
        mask[i, : len(example)] = torch.from_numpy(example.loss_mask)
    attention = (
        torch.arange(width)[None, :] < torch.tensor([len(e) for e in ours.examples])[:, None]
    )
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention.long()).logits
    labels = shift_labels(ids, mask)
    loss = sft_loss(logits, labels)
    assert abs(loss.item() - expected) < 1e-5
    # split over micro-batches of one row with the global count: the same token mean
    total = int((labels != -100).sum())
    assert total == ours.report.loss_tokens
    split = sum(sft_loss(logits[i : i + 1], labels[i : i + 1], total) for i in range(len(ours)))
    assert abs(split.item() - expected) < 1e-5


def test_loss_equals_transformers_causal_lm_loss(tmp_path):
    """Per micro-batch, sft_loss with num_items_in_batch equals transformers' ForCausalLMLoss."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    ours = _ours(MESSAGES_ROWS, max_length=128)
    tokenizer = tiny_chat_tokenizer()
    model = tiny_llama(len(tokenizer), seed=1)
    total = ours.report.loss_tokens
    mine = theirs = 0.0
    for example in ours.examples:
        ids = torch.from_numpy(example.input_ids)[None]
        hf_labels = torch.where(torch.from_numpy(example.loss_mask)[None], ids, -100)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        theirs += ForCausalLMLoss(
            logits, hf_labels, len(tokenizer), num_items_in_batch=total
        ).item()
        mine += sft_loss(
            logits, shift_labels(ids, torch.from_numpy(example.loss_mask)[None]), total
        ).item()
    assert abs(mine - theirs) < 1e-5
    assert np.isfinite(mine)
