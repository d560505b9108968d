"""The per-epoch summary compares mask repeats with chance (issue 26).

A T5 run said "masks repeated in epoch(s) [3]" when 1 of 7 short repeated sentence runs
drew the same spans, which chance predicts for 2-sentence samples: it now says how many
matched against how many chance would, and flags only repeats clearly above chance.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from epochal.train.inputs.epoch_evidence import _chance_same, above_chance, epoch_summary


def _records(same: list[int], chance: list[float] | None, masks: list[str] | None = None):
    out = []
    for k in range(4):
        r = {
            "kind": "epoch",
            "epoch": k,
            "step": k + 1,
            "first_sample": 10 * k,
            "samples_per_epoch": 10,
            "order": f"o{k}",
            "masks": masks[k] if masks else f"m{k}",
            "repeats": [0, 2, 2, 3][k],
            "same_masks": same[k],
        }
        if chance is not None:
            r["chance_same_masks"] = chance[k]
        out.append(r)
    out.append({"kind": "train", "step": 4, "epoch": 4.0})
    return out


def test_one_match_that_chance_predicts_is_not_called_a_repeat():
    line = epoch_summary(_records([0, 0, 0, 1], [0.0, 0.5, 0.5, 0.6]))
    assert "masks repeated" not in line
    assert "masks matched in 1 of 7 repeated sentence runs, as chance predicts" in line
    assert "about 1.6 expected" in line and "sample order differed in every epoch" in line


def test_matches_clearly_above_chance_or_identical_epochs_are_flagged():
    line = epoch_summary(_records([0, 2, 2, 3], [0.0, 0.01, 0.01, 0.01]))
    assert "masks repeated in epoch(s) [2, 3, 4]: 7 of 7 repeated sentence runs" in line
    assert "about 0.0 expected by chance" in line
    line = epoch_summary(_records([0, 0, 0, 0], [0.0, 0.1, 0.1, 0.1], masks=["a", "b", "b", "c"]))
    assert "masks repeated in epoch(s) [3]" in line and "identical to the previous" in line
    assert epoch_summary(_records([0, 0, 0, 0], [0.0, 0.1, 0.1, 0.1])).endswith(
        "sample order and masks differed in every epoch (checked at 3 epoch starts, "
        "7 repeated sentence runs compared)"
    )


def test_records_without_an_estimate_count_chance_as_zero():
    assert "masks repeated in epoch(s) [4]" in epoch_summary(_records([0, 0, 0, 1], None))


def test_chance_of_the_same_masks():
    tokens = types.SimpleNamespace(sentinels=())  # no WordPiece vocabulary: one token per unit
    bert = {  # [CLS] 6 tokens [SEP], the 3rd position masked
        "text": np.array([1, 10, 4, 12, 13, 14, 15, 2, 0, 0, 0, 0]),
        "labels": np.array([-1, -1, 11, -1, -1, -1, -1, -1, -1, -1, -1, -1]),
        "padding_mask": np.array([1] * 8 + [0] * 4),
        "loss_mask": np.array([0, 0, 1] + [0] * 9),
    }
    # 8 units here ([CLS]/[SEP] only drop out with a WordPiece vocabulary): 1 / C(8, 1)
    assert _chance_same(bert, tokens) == pytest.approx(1 / 8)
    t5 = {  # encoder: 5 <s0> 7 8 ; decoder: [BOS] <s0> a b -> one span of 2 of 5 tokens
        "text_enc": np.array([5, 100, 7, 8, 0, 0]),
        "enc_mask": np.array([1, 1, 1, 1, 0, 0]),
        "text_dec": np.array([99, 100, 20, 21, 0]),
        "dec_mask": np.array([1, 1, 1, 1, 0]),
        "loss_mask": np.array([1, 1, 1, 1, 0]),
    }
    spans = types.SimpleNamespace(sentinels=(100, 101))
    assert _chance_same(t5, spans) == pytest.approx(1 / 4)  # 4 places for the span
    t5 = {  # encoder: <s0> 7 <s1> 9 ; decoder: [BOS] <s0> a <s1> b c -> spans of 1 and 2 of 5
        "text_enc": np.array([100, 7, 101, 9]),
        "enc_mask": np.array([1, 1, 1, 1]),
        "text_dec": np.array([99, 100, 20, 101, 21, 22]),
        "dec_mask": np.array([1] * 6),
        "loss_mask": np.array([1] * 6),
    }
    # 2 separated runs of 3 tokens in 5: C(3, 2) placements x C(2, 1) splits = 6
    assert _chance_same(t5, spans) == pytest.approx(1 / (math.comb(3, 2) * math.comb(2, 1)))
    assert not above_chance(1, 1.5) and above_chance(7, 0.03) and not above_chance(0, 0.0)


def test_whole_words_are_the_units():
    """With a WordPiece vocabulary a word and its ## pieces are one unit; [CLS]/[SEP] none."""
    from epochal.data.datasets.masked_lm import WordPieceVocabulary

    tok = types.SimpleNamespace(
        cls=1,
        sep=2,
        mask=3,
        inv_vocab={
            0: "[PAD]",
            1: "[CLS]",
            2: "[SEP]",
            3: "[MASK]",
            10: "a",
            11: "##b",
            12: "c",
            13: "d",
        },
    )
    dataset = types.SimpleNamespace(
        vocab=WordPieceVocabulary(tok), masking=types.SimpleNamespace(do_full_word=True)
    )
    bert = {  # [CLS] a ##b c d [SEP]: 3 words, "a ##b" masked
        "text": np.array([1, 3, 3, 12, 13, 2]),
        "labels": np.array([-1, 10, 11, -1, -1, -1]),
        "padding_mask": np.ones(6, dtype=np.int64),
        "loss_mask": np.array([0, 1, 1, 0, 0, 0]),
    }
    assert _chance_same(bert, dataset) == pytest.approx(1 / 3)
