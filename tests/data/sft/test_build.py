"""build_sft_datasets: files -> split -> tokenized -> padded or packed train / validation samples."""

from __future__ import annotations

import json

import pytest

from epochal.data.sft import (
    PackedSFTDataset,
    SFTDataError,
    SFTDataset,
    build_sft_datasets,
    read_sft_rows,
    tokenize_sft_rows,
)
from tests.data.sft.tiny_chat import MESSAGES_ROWS, tiny_chat_tokenizer

pytest.importorskip("transformers")


def _file(path, n):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps(MESSAGES_ROWS[i % len(MESSAGES_ROWS)]) + "\n")
    return str(path)


def _rows_in(dataset):
    """(source, index) of every row in every sample of a dataset, in sample order."""
    if isinstance(dataset, PackedSFTDataset):
        return [
            (dataset.examples[i].source, dataset.examples[i].index) for b in dataset.bins for i in b
        ]
    return [(e.source, e.index) for e in dataset.examples]


@pytest.mark.parametrize("packing", [False, True])
def test_split_parts_hold_every_row_once(packing, tmp_path):
    path = _file(tmp_path / "chat.jsonl", 20)
    tokenizer = tiny_chat_tokenizer()
    data = build_sft_datasets(path, tokenizer, seq_length=96, split="80,15,5", packing=packing)
    kind = PackedSFTDataset if packing else SFTDataset
    assert all(isinstance(d, kind) for d in (data.train, data.valid, data.test))
    train, valid, test = (sorted(_rows_in(d)) for d in (data.train, data.valid, data.test))
    assert train == [(path, i) for i in range(16)]
    assert valid == [(path, i) for i in range(16, 19)] and test == [(path, 19)]
    assert data.reports["valid"].rows == 3
    assert data.train.pad_token_id == tokenizer.pad_token_id
    # the samples hold exactly the tokenized rows' loss tokens
    expected = tokenize_sft_rows(read_sft_rows(path)[:16], tokenizer).report.loss_tokens
    assert sum(float(data.train[i]["loss_mask"].sum()) for i in range(len(data.train))) == expected
    summary = data.summary()
    assert summary.startswith("train: 16 rows -> 16 examples") and "\nvalid: 3 rows" in summary
    assert ("real tokens" in summary) == packing


def test_valid_file_and_errors(tmp_path):
    train = _file(tmp_path / "train.jsonl", 6)
    valid = _file(tmp_path / "valid.jsonl", 2)
    tokenizer = tiny_chat_tokenizer()
    data = build_sft_datasets(train, tokenizer, seq_length=96, valid_file=valid)
    assert data.test is None and sorted(_rows_in(data.valid)) == [(valid, 0), (valid, 1)]
    assert build_sft_datasets(train, tokenizer, seq_length=96).valid is None
    with pytest.raises(SFTDataError, match="either a validation file or a split"):
        build_sft_datasets(train, tokenizer, seq_length=96, valid_file=valid, split="9,1")
    with pytest.raises(SFTDataError, match=r"split '99,1' leaves no valid rows of 6"):
        build_sft_datasets(train, tokenizer, seq_length=96, split="99,1")
    with pytest.raises(SFTDataError, match="no train row is left"):
        build_sft_datasets(train, tokenizer, seq_length=20, overlength="skip")
    first = len(tokenize_sft_rows(read_sft_rows(train)[:1], tokenizer)[0])
    with pytest.raises(SFTDataError, match=rf"train\.jsonl row 0 \(line 1\): {first} tokens, over"):
        build_sft_datasets(train, tokenizer, seq_length=first - 1)


def test_reports_count_one_in_the_singular():
    from epochal.data.sft import PackingReport, SFTReport

    one = SFTReport(1, 1, 0, 0, 0, 0, tokens=1, loss_tokens=1, max_length=8)
    assert one.summary() == "1 row -> 1 example, 1 token, 1 loss token"
    assert PackingReport(1, 1, 8, 4).summary().startswith("1 row in 1 sample of 8 tokens: ")
