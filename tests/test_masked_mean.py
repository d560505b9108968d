"""The one masked mean: its value, its zero on an empty mask, and its bits."""

from __future__ import annotations

import torch

from epochal._masked_mean import masked_mean, masked_sum_and_count, mean_from_sum


def test_mean_over_kept_entries() -> None:
    values = torch.tensor([1.0, 2.0, 3.0, 10.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert masked_mean(values, mask).item() == 2.0
    total, count = masked_sum_and_count(values, mask)
    assert (total.item(), count.item()) == (6.0, 3.0)


def test_empty_mask_gives_zero_not_nan() -> None:
    values = torch.tensor([1.0, 2.0])
    assert masked_mean(values, torch.zeros(2)).item() == 0.0
    assert mean_from_sum(torch.tensor(0.0), torch.tensor(0)).item() == 0.0


def test_bool_mask_equals_float_mask() -> None:
    values = torch.randn(64, generator=torch.Generator().manual_seed(0))
    keep = values > 0
    assert torch.equal(masked_mean(values, keep), masked_mean(values, keep.float()))


def test_bits_of_the_written_out_form() -> None:
    g = torch.Generator().manual_seed(1)
    losses = torch.rand(4, 33, generator=g).flatten()
    mask = (torch.rand(4, 33, generator=g) > 0.3).float().flatten()
    expected = (losses * mask).sum() / mask.sum().clamp(min=1.0)
    assert torch.equal(masked_mean(losses, mask), expected)
