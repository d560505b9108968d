"""Tests of the global-RNG detector used by the determinism checks."""

import random

import numpy as np
import pytest
import torch

from epochal.testing import detect_global_rng_use
from epochal.testing.global_rng import preserve_global_rng


def test_clean_block_has_no_findings():
    with detect_global_rng_use() as findings:
        torch.rand(3, generator=torch.Generator().manual_seed(1))
        np.random.default_rng(3).random(2)
        random.Random(4).random()
    assert findings == []


def test_findings_name_the_call_once():
    with detect_global_rng_use() as findings:
        torch.manual_seed(7)  # internally also seeds CUDA: reported once
    assert findings[0] == "called torch.manual_seed(7)"
    assert not any("cuda" in f for f in findings)
    assert any("CPU generator" in f for f in findings)


def test_each_generator_is_named():
    with detect_global_rng_use() as findings:
        random.random()
        np.random.rand()  # noqa: NPY002
        torch.randn(1)
    text = "\n".join(findings)
    assert "`random`" in text and "numpy" in text and "torch's default CPU" in text


def test_state_and_functions_restored_on_error():
    torch.manual_seed(11)
    before = torch.get_rng_state()
    original = torch.manual_seed
    with pytest.raises(RuntimeError, match="inside"):
        with detect_global_rng_use():
            torch.manual_seed(3)
            raise RuntimeError("inside")
    assert torch.manual_seed is original
    assert torch.equal(torch.get_rng_state(), before)


def test_preserve_global_rng():
    random.seed(1)
    expected = random.random()
    random.seed(1)
    with preserve_global_rng():
        random.random()
        torch.rand(4)
    assert random.random() == expected
