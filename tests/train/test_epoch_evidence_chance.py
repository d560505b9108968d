"""The per-epoch summary compares mask repeats with chance (issue 26).

A T5 run said "masks repeated in epoch(s) [3]" when 1 of 7 short repeated sentence runs
drew the same spans, which chance predicts for 2-sentence samples: it now says how many
matched against how many chance would, and flags only repeats clearly above chance.
"""

from __future__ import annotations

import math

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
    bert = {
        "padding_mask": np.array([1] * 8 + [0] * 4),  # [CLS] 6 tokens [SEP]
        "types": np.zeros(12, dtype=np.int64),
        "loss_mask": np.array([0, 0, 1] + [0] * 9),
    }
    assert _chance_same(bert, frozenset()) == pytest.approx(1 / 6)
    bert["types"] = np.array([0] * 4 + [1] * 4 + [0] * 4)  # two segments: one more [SEP]
    assert _chance_same(bert, frozenset()) == pytest.approx(1 / 5)
    t5 = {  # encoder: 5 <s0> 7 8 ; decoder: [BOS] <s0> a b -> one span of 2 of 5 tokens
        "text_enc": np.array([5, 100, 7, 8, 0, 0]),
        "enc_mask": np.array([1, 1, 1, 1, 0, 0]),
        "loss_mask": np.array([1, 1, 1, 1, 0]),
    }
    assert _chance_same(t5, frozenset({100})) == pytest.approx(1 / 4)  # 4 places for the span
    t5 = {  # encoder: <s0> 7 <s1> 9 ; decoder: [BOS] <s0> a <s1> b c -> spans of 1 and 2 of 5
        "text_enc": np.array([100, 7, 101, 9]),
        "enc_mask": np.array([1, 1, 1, 1]),
        "loss_mask": np.array([1] * 6),
    }
    # 2 separated spans of 3 tokens in 5: C(3, 2) placements x C(2, 1) splits = 6
    assert _chance_same(t5, frozenset({100, 101})) == pytest.approx(1 / 6)
    assert math.comb(3, 2) * math.comb(2, 1) == 6
    assert not above_chance(1, 1.5) and above_chance(7, 0.03) and not above_chance(0, 0.0)
