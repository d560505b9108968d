"""Micro-batch calculators: hand-computed schedules, errors, and a peer test against Megatron-Core."""

from __future__ import annotations

import importlib.util
import itertools
import os

import pytest

from epochal.data import (
    ConstantNumMicroBatchesCalculator,
    MicroBatchConfigError,
    RampupBatchsizeNumMicroBatchesCalculator,
    build_num_microbatches_calculator,
)


def test_constant_calculator_values():
    calc = ConstantNumMicroBatchesCalculator(
        global_batch_size=32, micro_batch_size=2, data_parallel_size=4
    )
    assert calc.num_microbatches_at(0) == 4
    assert calc.num_microbatches_at(10**12) == 4
    assert calc.global_batch_size_at(123) == 32
    assert calc.consumed_samples_after(5, start=64) == 64 + 5 * 32
    assert calc.complete_steps_within(0, 100) == (3, 96)
    assert calc.complete_steps_within(32, 31) == (0, 32)
    # Megatron-style stateful interface
    calc.update(1000, consistency_check=True)
    assert calc.get() == 4 and calc.get_current_global_batch_size() == 32
    assert calc.get_micro_batch_size() == 2 and calc.get_current_running_global_batch_size() == 32


def test_constant_calculator_decrease_if_needed():
    calc = ConstantNumMicroBatchesCalculator(30, 2, 4, decrease_batch_size_if_needed=True)
    assert calc.global_batch_size_at(0) == 30
    assert calc.running_global_batch_size_at(0) == 24
    assert calc.num_microbatches_at(0) == 3
    assert calc.consumed_samples_after(2) == 48


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"global_batch_size": 30, "micro_batch_size": 2, "data_parallel_size": 4}, "divisible"),
        (
            {"global_batch_size": 0, "micro_batch_size": 2, "data_parallel_size": 1},
            "global_batch_size",
        ),
        (
            {"global_batch_size": 8, "micro_batch_size": 0, "data_parallel_size": 1},
            "micro_batch_size",
        ),
        (
            {"global_batch_size": 8, "micro_batch_size": 2, "data_parallel_size": 0},
            "data_parallel_size",
        ),
        (
            {"global_batch_size": 8, "micro_batch_size": 2.0, "data_parallel_size": 1},
            "micro_batch_size",
        ),
        (
            {"global_batch_size": True, "micro_batch_size": 1, "data_parallel_size": 1},
            "global_batch_size",
        ),
        (
            {
                "global_batch_size": 2,
                "micro_batch_size": 2,
                "data_parallel_size": 2,
                "decrease_batch_size_if_needed": True,
            },
            "at least one micro-batch",
        ),
    ],
)
def test_constant_calculator_errors(kwargs, needle):
    with pytest.raises(MicroBatchConfigError, match=needle):
        ConstantNumMicroBatchesCalculator(**kwargs)


def test_rampup_schedule_hand_computed():
    # 8 -> 16 -> 24 -> 32 over 300 samples: 3 increments, one every 100 samples.
    calc = RampupBatchsizeNumMicroBatchesCalculator(32, 2, 2, 8, 8, 300)
    expected = {0: 8, 99: 8, 100: 16, 199: 16, 200: 24, 299: 24, 300: 32, 301: 32, 10**9: 32}
    for consumed, gbs in expected.items():
        assert calc.global_batch_size_at(consumed) == gbs, consumed
        assert calc.num_microbatches_at(consumed) == gbs // 4
    # steps start at 0, 8, ..., 96 (13 steps of 8), then 104.. in steps of 16 up to 200, ...
    starts = [s for s, _ in itertools.islice(calc.iter_global_batches(), 40)]
    sizes = [g for _, g in itertools.islice(calc.iter_global_batches(), 40)]
    assert starts[:14] == list(range(0, 105, 8)) and sizes[:13] == [8] * 13
    assert sizes[13] == 16 and starts[13] == 104
    # walking the schedule step by step gives the same result as consumed_samples_after
    for n in range(40):
        assert calc.consumed_samples_after(n) == starts[n]
    # resuming from a mid-ramp position
    assert calc.consumed_samples_after(3, start=starts[10]) == starts[13]
    steps, end = calc.complete_steps_within(0, 110)
    assert (steps, end) == (13, 104)


def test_rampup_degenerate_cases_are_constant():
    same = RampupBatchsizeNumMicroBatchesCalculator(16, 2, 1, 16, 4, 1000)  # start == final
    assert [same.global_batch_size_at(c) for c in (0, 500, 2000)] == [16, 16, 16]
    instant = RampupBatchsizeNumMicroBatchesCalculator(16, 2, 1, 4, 4, 0)  # no ramp-up samples
    assert [instant.global_batch_size_at(c) for c in (0, 1, 50)] == [16, 16, 16]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((32, 2, 2, 40, 8, 300), "must be <= global_batch_size"),
        ((32, 2, 2, 8, 5, 300), "divisible by rampup_batch_size\\[1\\]"),
        ((32, 2, 2, 6, 2, 300), "not divisible by micro_batch_size"),  # 6 % 4 != 0
        ((32, 2, 2, 0, 8, 300), "start"),
        ((32, 2, 2, 8, 0, 300), "increment"),
        ((32, 2, 2, 8, 8, -1), "ramp-up samples"),
    ],
)
def test_rampup_errors(args, needle):
    with pytest.raises(MicroBatchConfigError, match=needle):
        RampupBatchsizeNumMicroBatchesCalculator(*args)


def test_build_calculator():
    assert isinstance(build_num_microbatches_calculator(8, 2, 2), ConstantNumMicroBatchesCalculator)
    ramp = build_num_microbatches_calculator(8, 2, 1, [2, 2, 10])
    assert isinstance(ramp, RampupBatchsizeNumMicroBatchesCalculator)
    assert ramp.rampup_batch_size == [2, 2, 10]
    for bad in ([2, 2], "2 2 10", [2, 2, 10, 4]):
        with pytest.raises(MicroBatchConfigError, match="rampup_batch_size must be"):
            build_num_microbatches_calculator(8, 2, 1, bad)


# --------------------------------------------------------------------- peer test
_CONFIGS = [
    (64, 2, 4, None, False),
    (60, 2, 4, None, True),
    (64, 1, 2, [16, 8, 1000], False),
    (96, 2, 2, [8, 4, 777], False),  # non-integral samples per increment (777 / 22)
    (48, 4, 1, [4, 4, 100], False),
    (100, 2, 3, [10, 10, 500], True),  # rounded down stages
]


@pytest.fixture(scope="module")
def megatron_calculators():
    """Megatron-Core's calculator module, loaded from its file.

    The module only needs the standard library; loading the file directly skips the
    package ``megatron.core.__init__``, which takes seconds to import.
    """
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed")
    path = os.path.join(
        spec.submodule_search_locations[0], "core", "num_microbatches_calculator.py"
    )
    if not os.path.isfile(path):
        pytest.skip(f"{path} not found")
    module_spec = importlib.util.spec_from_file_location(
        "_megatron_num_microbatches_calculator", path
    )
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.mark.peer
@pytest.mark.parametrize(("gbs", "mbs", "dp", "rampup", "decrease"), _CONFIGS)
def test_matches_megatron_core(megatron_calculators, gbs, mbs, dp, rampup, decrease):
    mc = megatron_calculators
    theirs = mc._build_num_microbatches_calculator(
        rank=1,
        rampup_batch_size=rampup,
        global_batch_size=gbs,
        micro_batch_size=mbs,
        data_parallel_size=dp,
        decrease_batch_size_if_needed=decrease,
    )
    ours = build_num_microbatches_calculator(gbs, mbs, dp, rampup, decrease)
    # Walk Megatron's training loop: update with consumed samples after every step.
    consumed = 0
    for _ in range(400):
        theirs.update(consumed, consistency_check=not decrease)
        ours.update(consumed)
        assert ours.get() == theirs.get()
        assert ours.get_current_global_batch_size() == theirs.get_current_global_batch_size()
        assert (
            ours.get_current_running_global_batch_size()
            == theirs.get_current_running_global_batch_size()
        )
        consumed += theirs.get_current_running_global_batch_size()
    assert ours.consumed_samples_after(400) == consumed
    for probe in range(0, 2000, 7):
        theirs.update(probe, consistency_check=False)
        assert ours.num_microbatches_at(probe) == theirs.get(), probe


@pytest.mark.peer
@pytest.mark.parametrize(("gbs", "mbs", "dp", "rampup", "decrease"), _CONFIGS)
def test_megatron_public_attributes(megatron_calculators, gbs, mbs, dp, rampup, decrease):
    # users' code reads calculator.num_micro_batches, .current_global_batch_size, ...
    theirs = megatron_calculators._build_num_microbatches_calculator(
        rank=0,
        rampup_batch_size=rampup,
        global_batch_size=gbs,
        micro_batch_size=mbs,
        data_parallel_size=dp,
        decrease_batch_size_if_needed=decrease,
    )
    ours = build_num_microbatches_calculator(gbs, mbs, dp, rampup, decrease)
    consumed = 0
    for _ in range(60):
        theirs.update(consumed, consistency_check=False)
        ours.update(consumed)
        for name, value in vars(theirs).items():
            if name == "rank":  # Megatron's logging rank, not a property of the schedule
                continue
            assert getattr(ours, name) == value, (name, consumed)
        consumed += theirs.current_running_global_batch_size
