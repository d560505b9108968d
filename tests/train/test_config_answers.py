"""``epochal.train.config.answers``: the configuration the answers of ``epochal config`` make."""

from __future__ import annotations

import pytest

from epochal.model.config import ConfigError
from epochal.train.config import to_toml
from epochal.train.config.answers import (
    AnswerError,
    answers_overrides,
    answers_world_size,
    config_from_answers,
    launch_commands,
)

ANSWERS = {
    "preset": "tiny",
    "nodes": 1,
    "tensor_parallel": 2,
    "sequence_parallel": True,
    "pipeline_parallel": 1,
    "data_parallel": 2,
    "micro_batch_size": 2,
    "global_batch_size": 8,
    "selective_recompute": True,
    "distributed_optimizer": True,
    "clip_grad": 0.5,
    "precision": "bf16",
    "data": "mock",
}


def test_answers_make_the_configuration():
    config = config_from_answers(ANSWERS)
    assert config.parallel.tensor_parallel == 2 and config.parallel.sequence_parallel
    assert config.parallel.data_parallel == 2 and config.parallel.nproc_per_node == 4
    assert config.parallel.recompute_granularity == "selective"
    assert config.parallel.dp_sharding == "optimizer"
    assert config.training.global_batch_size == 8 and config.training.bf16
    assert config.optimizer.clip_grad == 0.5 and config.data.mock
    assert "--data.mock=true" in answers_overrides(ANSWERS)
    assert "[parallel]" in to_toml(config)
    assert answers_world_size(ANSWERS) == 4
    assert launch_commands("a b.toml", ANSWERS) == [
        "epochal train --config 'a b.toml'",
        "torchrun --standalone --nproc-per-node=4 -m epochal.cli train --config 'a b.toml'",
    ]


def test_a_prefix_of_the_answers_is_checked_too():
    config = config_from_answers({"preset": "tiny", "nodes": 1, "tensor_parallel": 2})
    assert config.parallel.tensor_parallel == 2


def test_bad_answers_name_the_reason():
    with pytest.raises(AnswerError, match="cannot be split evenly over 3 nodes"):
        config_from_answers({**ANSWERS, "nodes": 3})
    with pytest.raises(ConfigError, match="tensor_parallel"):
        config_from_answers({"preset": "tiny", "nodes": 1, "tensor_parallel": 3})
    with pytest.raises(ConfigError, match="global_batch_size"):
        config_from_answers({**ANSWERS, "global_batch_size": 6})
