"""Packing fine-tuning rows: TRL's best-fit-decreasing bins, per-row attention, the same loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochal.data.sft import (
    rows_from_records,
    sft_loss,
    sft_loss_sum,
    shift_labels,
    tokenize_sft_rows,
)
from epochal.data.sft.packing import (
    PackedSFTDataset,
    SFTDataset,
    best_fit_bins,
    collate_packed,
    cu_seqlens_from_positions,
)
from epochal.data.sft.tokenize import SFTExample
from tests.data.sft.tiny_chat import (
    CONVERSATIONAL_PC_ROWS,
    MESSAGES_ROWS,
    tiny_chat_tokenizer,
    tiny_llama,
)


def _lengths(n=300, high=64, seed=0):
    return np.random.default_rng(seed).integers(1, high + 1, size=n).tolist()


def test_best_fit_bins_hold_every_item_once_and_fit():
    lengths = _lengths()
    bins = best_fit_bins(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 64 for b in bins)
    assert sum(lengths) / (len(bins) * 64) > 0.95  # uniform 1..64 rows fill the bins
    assert best_fit_bins(lengths, 64) == bins  # deterministic
    assert best_fit_bins([3, 3, 2, 4], 6) == [[3, 2], [0, 1]]  # longest first, best fit
    with pytest.raises(ValueError, match="item 1 has length 7; packing needs 1..6"):
        best_fit_bins([1, 7], 6)


@pytest.mark.peer
def test_best_fit_bins_equal_trl_bfd_packing():
    datasets = pytest.importorskip("datasets")
    data_utils = pytest.importorskip("trl.data_utils")
    lengths = _lengths(n=200, high=48, seed=1) + [16] * 10  # many ties
    starts = np.cumsum([0] + lengths[:-1])
    rows = [{"input_ids": list(range(s, s + n))} for s, n in zip(starts, lengths)]
    packed = data_utils.pack_dataset(datasets.Dataset.from_list(rows), 64, "bfd")
    bins = best_fit_bins(lengths, 64)
    assert len(packed) == len(bins)
    for theirs, ours in zip(packed, bins):
        assert theirs["seq_lengths"] == [lengths[i] for i in ours]
        assert theirs["input_ids"] == [t for i in ours for t in rows[i]["input_ids"]]


def _examples():
    tokenizer = tiny_chat_tokenizer()
    out = []
    for records in (MESSAGES_ROWS, CONVERSATIONAL_PC_ROWS):
        rows = rows_from_records([(None, r) for r in records], source="rows.jsonl")
        out += tokenize_sft_rows(rows, tokenizer).examples
    return out, tokenizer


def _block_causal(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[1, 1, T, T] bool: causal attention within each sequence of cu_seqlens."""
    seq = torch.zeros(total, dtype=torch.long)
    for k in range(len(cu_seqlens) - 1):
        seq[cu_seqlens[k] : cu_seqlens[k + 1]] = k
    pos = torch.arange(total)
    return ((seq[:, None] == seq[None, :]) & (pos[:, None] >= pos[None, :]))[None, None]


def _loss(model, batch):
    total = batch["tokens"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=batch["tokens"],
            position_ids=batch["position_ids"],
            attention_mask=_block_causal(batch["cu_seqlens"], total),
        ).logits
    labels = torch.where(batch["loss_mask"].bool(), batch["labels"], -100)
    return sft_loss(logits, labels), int(batch["loss_mask"].sum())


@pytest.mark.peer
def test_packed_loss_equals_unpacked_rows_loss():
    """The same tokens and loss tokens, the loss equal within 1e-5, on a transformers Llama."""
    examples, tokenizer = _examples()
    seq_length = 128
    packed = PackedSFTDataset(examples, seq_length, pad_token_id=tokenizer.pad_token_id)
    padded = SFTDataset(examples, seq_length, pad_token_id=tokenizer.pad_token_id)
    assert len(packed) < len(padded) == len(examples)
    model = tiny_llama(len(tokenizer))
    packed_loss, packed_count = _loss(
        model, collate_packed([packed[i] for i in range(len(packed))])
    )
    padded_loss, padded_count = _loss(
        model, collate_packed([padded[i] for i in range(len(padded))])
    )
    assert packed_count == padded_count == sum(e.num_loss_tokens for e in examples)
    # the reference: each row alone through transformers' own causal-LM loss
    total = 0.0
    for e in examples:
        ids = torch.from_numpy(e.input_ids)[None]
        labels = torch.where(torch.from_numpy(e.loss_mask)[None], ids, -100)
        with torch.no_grad():
            out = model(input_ids=ids, labels=labels)
        total += out.loss.item() * e.num_loss_tokens
    reference = total / packed_count
    assert abs(packed_loss.item() - reference) < 1e-5
    assert abs(padded_loss.item() - reference) < 1e-5


def test_packed_samples_restart_positions_and_mask_row_ends():
    examples, tokenizer = _examples()
    packed = PackedSFTDataset(examples, 128, pad_token_id=tokenizer.pad_token_id)
    seen = []
    for b, sample in zip(packed.bins, (packed[i] for i in range(len(packed)))):
        cu = cu_seqlens_from_positions(sample["position_ids"]).tolist()
        assert cu[0] == 0 and cu[-1] == 128
        for k, i in enumerate(b):
            start, end = cu[k], cu[k + 1]
            e = examples[i]
            assert end - start == len(e)
            assert sample["tokens"][start:end].tolist() == e.input_ids.tolist()
            assert sample["position_ids"][start:end].tolist() == list(range(len(e)))
            assert sample["labels"][start : end - 1].tolist() == e.input_ids[1:].tolist()
            assert sample["loss_mask"][start : end - 1].tolist() == e.loss_mask[1:].tolist()
            assert sample["loss_mask"][end - 1] == 0  # no target across a row's end
            seen.append(i)
        assert sample["loss_mask"][cu[len(b)] :].sum() == 0  # padding
    assert sorted(seen) == list(range(len(examples)))
    report = packed.report
    assert report.tokens == sum(len(e) for e in examples)
    assert report.efficiency == report.tokens / (len(packed) * 128)
    assert report.padded_efficiency == report.tokens / (len(examples) * 128)
    assert report.efficiency > report.padded_efficiency
    assert f"{len(examples)} rows in {len(packed)} samples of 128 tokens" in report.summary()


def test_an_example_longer_than_the_sample_is_an_error_naming_it():
    long = SFTExample(np.arange(9), np.ones(9, dtype=bool), "chat.jsonl", 4)
    with pytest.raises(ValueError, match="chat.jsonl row 4: 9 tokens do not fit seq_length 8"):
        PackedSFTDataset([long], 8)
    with pytest.raises(ValueError, match="samples of one length"):
        collate_packed([SFTDataset([long], 9)[0], SFTDataset([long], 10)[0]])


def test_attention_masks_and_stacked_samples_through_epochal_gpt_give_the_rows_loss():
    """Packed samples with GPTDataset's attention_mask, default-collated, through epochal's
    GPT (rope): the loss of every row alone, within 1e-5; the mask equals cu_seqlens'."""
    from torch.utils.data import default_collate

    from epochal.model import GPTModel, ModelConfig

    examples, tokenizer = _examples()
    config = ModelConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        position_embedding_type="rope",
    )
    torch.manual_seed(0)
    model = GPTModel(config).eval()
    packed = PackedSFTDataset(examples, 128, pad_token_id=0, create_attention_mask=True)
    batch = default_collate([packed[i] for i in range(len(packed))])
    assert batch["attention_mask"].shape == (len(packed), 1, 128, 128)
    for i in range(len(packed)):
        cu = cu_seqlens_from_positions(batch["position_ids"][i])
        assert torch.equal(batch["attention_mask"][i, 0], ~_block_causal(cu, 128)[0, 0])
    with torch.no_grad():
        logits = model(batch["tokens"], batch["position_ids"], batch["attention_mask"]).float()
    labels = torch.where(batch["loss_mask"].bool(), batch["labels"], -100)
    packed_loss = sft_loss(logits, labels)
    total, count = 0.0, 0
    for e in examples:
        ids = torch.from_numpy(e.input_ids)[None]
        with torch.no_grad():
            row_logits = model(ids).float()
        row_labels = shift_labels(ids, torch.from_numpy(e.loss_mask)[None])
        total += sft_loss_sum(row_logits, row_labels).item()
        count += e.num_loss_tokens
    assert int((labels != -100).sum()) == count
    assert abs(packed_loss.item() - total / count) < 1e-5
