"""``epochal._checks``: the checker every configuration section runs, driven by the annotations."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import pytest

from epochal._checks import Check, ConfigError, check_fields, checked, is_int, is_real
from epochal.model.config import ModelConfig
from epochal.parallel.config import ParallelConfig


@dataclass(kw_only=True)
class _Section:
    count: int = checked(1, ge=1)
    rate: float = checked(0.5, ge=0, lt=1)
    scale: float = checked(1.0, gt=0)
    flag: bool = checked(False)
    maybe_flag: bool | None = checked(None)
    kind: Literal["a", "b"] = checked("a")
    maybe_kind: Literal["a", "b"] | None = checked(None)
    name: str = checked("x")
    window: int | None = checked(None, ge=1, none="no window", note="tokens")
    buckets: int = checked(4, ge=4, even=True)
    steps: int = checked(0, ge=0, lt=2**32, text="in [0, 2**32)")
    late: int = checked(1, ge=1, group="later")
    free: int = 7  # not checked: a rule between fields covers it


def _refusal(**values) -> str:
    with pytest.raises(ConfigError) as err:
        check_fields(_Section(**values))
    return str(err.value)


def test_predicates_refuse_bools_and_non_finite_numbers():
    assert is_int(3) and not is_int(True) and not is_int(3.0)
    assert is_real(3) and is_real(2.5) and not is_real(False)
    assert not any(is_real(v) for v in (math.nan, math.inf, -math.inf, "1"))


@pytest.mark.parametrize(
    "values,message",
    [
        ({"count": 0}, "count: must be an integer >= 1, got 0"),
        ({"count": True}, "count: must be an integer >= 1, got True"),
        ({"count": 2.0}, "count: must be an integer >= 1, got 2.0"),
        ({"rate": 1}, "rate: must be in [0, 1), got 1"),
        ({"rate": math.nan}, "rate: must be in [0, 1), got nan"),
        ({"scale": math.inf}, "scale: must be > 0, got inf"),
        ({"scale": False}, "scale: must be > 0, got False"),
        ({"flag": 0}, "flag: must be true or false, got 0"),
        ({"maybe_flag": "yes"}, "maybe_flag: must be true, false or None, got 'yes'"),
        ({"kind": "c"}, "kind: must be one of ('a', 'b'), got 'c'"),
        ({"maybe_kind": "c"}, "maybe_kind: must be one of ('a', 'b') or None, got 'c'"),
        ({"name": 1}, "name: must be a string, got 1"),
        ({"window": 0}, "window: must be None (no window) or an integer >= 1 (tokens), got 0"),
        ({"buckets": 5}, "buckets: must be an even integer >= 4, got 5"),
        ({"steps": 2**32}, "steps: must be in [0, 2**32), got 4294967296"),
    ],
)
def test_a_value_outside_its_annotation_and_range_is_refused_naming_both(values, message):
    assert _refusal(**values) == message


def test_accepted_values_and_groups():
    accepted = _Section(rate=0, scale=3, maybe_flag=True, maybe_kind="b", window=None, free=-5)
    check_fields(accepted)  # an int for a float; None where allowed; unchecked fields untouched
    late = _Section(late=0)
    check_fields(late)  # another group: not checked with the default one
    with pytest.raises(ConfigError, match="late: must be an integer >= 1"):
        check_fields(late, "later")


def test_the_first_bad_field_in_declaration_order_is_named():
    assert _refusal(name=1, count=0).startswith("count:")


def test_an_annotation_the_checker_cannot_read_is_a_programming_error():
    @dataclass
    class Odd:
        values: list[int] = checked(default_factory=list)

    with pytest.raises(TypeError, match="cannot check a field annotated"):
        check_fields(Odd())


@pytest.mark.parametrize("cls", [ModelConfig, ParallelConfig])
def test_every_field_is_checked_from_its_annotation_or_by_a_written_rule(cls):
    # the fields left to the rules between fields (their range depends on another field)
    written = {
        ModelConfig: {
            "num_query_groups",
            "rope_high_freq_factor",
            "mask_token_id",
            "pad_token_id",
            "num_labels",
            "lora_target_modules",
            "moe_router_topk",
            "moe_layer_freq",
        },
        ParallelConfig: set(),
    }[cls]
    unchecked = {f.name for f in dataclasses.fields(cls) if "check" not in f.metadata}
    assert unchecked == written
    assert all(
        isinstance(f.metadata["check"], Check) for f in dataclasses.fields(cls) if f.metadata
    )
