"""MegatronLMDummyDataLoader passes a blend schedule to epochal's data options."""

from __future__ import annotations

import pytest

from epochal.accelerate.dummy_data import MegatronLMDummyDataLoader
from epochal.model.config import ConfigError
from epochal.train.config import DataConfig

SCHEDULE = [{"step": 0, "weights": [1, 0]}, {"step": 5, "weights": [1, 1]}]


def test_the_schedule_reaches_the_data_options():
    loader = MegatronLMDummyDataLoader(
        data_path=["1", "a", "1", "b"],
        micro_batch_size=2,
        blend_schedule=SCHEDULE,
        blend_schedule_interpolation="linear",
    )
    options = loader.data_options()
    data = DataConfig(**options)
    assert data.blend_schedule == SCHEDULE
    assert data.blend_schedule_interpolation == "linear"


def test_a_bad_schedule_is_refused_naming_the_option():
    loader = MegatronLMDummyDataLoader(
        data_path=["1", "a", "1", "b"],
        micro_batch_size=2,
        blend_schedule=[SCHEDULE[0] | {"weights": [1]}],
    )
    with pytest.raises(ConfigError, match=r"blend_schedule: point 0 .* needs 2 weights"):
        DataConfig(**loader.data_options())
