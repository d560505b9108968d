"""Tests of the nested sample comparator."""

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
import torch

from epochal.testing import assert_dict_tensors_approx_equal, assert_samples_equal


class Pair(NamedTuple):
    a: int
    b: torch.Tensor


@dataclasses.dataclass
class Rec:
    x: np.ndarray
    name: str


def sample():
    return {
        "t": torch.tensor([1.0, float("nan")]),
        "a": np.arange(3),
        "nested": [Pair(1, torch.ones(2)), (np.float32(2.5), None, "s", b"b")],
        "rec": Rec(np.zeros(2), "r"),
        "n": 3,
    }


def test_equal_nested_samples_pass():
    assert_samples_equal(sample(), sample())
    assert_dict_tensors_approx_equal({"t": torch.ones(2)}, {"t": torch.ones(2) + 1e-9})


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda s: s["t"].__setitem__(0, 2.0), r"sample\['t'\]"),
        (lambda s: s.__setitem__("t", s["t"].double()), "float64"),
        (lambda s: s["a"].__setitem__(1, 7), r"sample\['a'\]"),
        (lambda s: s.__setitem__("a", s["a"].astype(np.int32)), "int32"),
        (lambda s: s.__setitem__("a", torch.arange(3)), "type differs"),
        (lambda s: s.__setitem__("extra", 1), "keys differ"),
        (lambda s: s["nested"].append(1), "length differs"),
        (lambda s: s["nested"].__setitem__(1, list(s["nested"][1])), "type differs"),
        (lambda s: s["nested"].__setitem__(0, Pair(2, torch.ones(2))), r"\[0\]\[0\]"),
        (lambda s: s["nested"].__setitem__(0, Pair(1, torch.zeros(2))), r"\[0\]\[1\]"),
        (lambda s: s.__setitem__("rec", Rec(np.zeros(2), "q")), r"\.name"),
        (lambda s: s.__setitem__("rec", Rec(np.array([0.0, 1e-9]), "r")), r"\.x"),
        (lambda s: s.__setitem__("n", 4), "3 vs 4"),
        (lambda s: s.__setitem__("n", True), "type differs"),
    ],
)
def test_differences_are_reported_with_their_path(change, where):
    other = sample()
    change(other)
    with pytest.raises(AssertionError, match=where):
        assert_samples_equal(sample(), other)


def test_tolerances():
    a = {"x": torch.tensor([1.0]), "y": np.array([1.0]), "z": 1.0}
    b = {"x": torch.tensor([1.0 + 1e-7]), "y": np.array([1.0 + 1e-7]), "z": 1.0 + 1e-7}
    with pytest.raises(AssertionError):
        assert_samples_equal(a, b)
    assert_samples_equal(a, b, rtol=1e-6, atol=0)
    assert_samples_equal(np.int64(3), 3)
