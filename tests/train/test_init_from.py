"""Initializing a run from another checkpoint's weights (Megatron's --finetune) and model checks."""

from __future__ import annotations

import pytest
import torch

from epochal.train.state.checkpoint import CheckpointError
from epochal.train.state.epochal_ckpt import save_epochal_checkpoint
from tests.train.test_trainer import trainer


def _weights(tr):
    return {k: v.detach().clone() for k, v in tr.model_parts[0].state_dict().items()}


def test_init_from_loads_weights_and_starts_fresh(tmp_path):
    src = trainer(tmp_path / "src")
    src.train()  # 4 steps, checkpoints at steps 2 and 4
    trained = _weights(src)
    fresh = trainer(tmp_path / "dst", "--training.seed=7")
    assert any(not torch.equal(trained[k], v) for k, v in _weights(fresh).items())

    tuned = trainer(
        tmp_path / "dst2", "--training.seed=7", f"--checkpoint.init_from={tmp_path / 'src'}"
    )
    tuned.init_from_checkpoint(tuned.find_checkpoint(tmp_path / "src", "init_from"))
    for k, v in _weights(tuned).items():
        assert torch.equal(trained[k], v), k
    assert tuned.step == 0 and tuned.data.train_loader.consumed_samples == 0

    result = tuned.train()  # nothing to resume: init_from applies, then 4 fresh steps
    assert result.start_step == 0 and result.final_step == 4
    assert tuned.data.train_loader.consumed_samples == 4 * 6


def test_model_only_checkpoint_initializes_instead_of_resuming(tmp_path):
    src = trainer(tmp_path / "src")
    state = _weights(src)
    run = tmp_path / "converted"
    save_epochal_checkpoint(src.model_config, state, run, source="test")
    tr = trainer(run)  # resume="auto" finds the model-only step_0000000
    result = tr.train()
    assert result.start_step == 0 and result.final_step == 4
    # The first step started from the converted weights: same loss as the source model's first step.
    first_src = src.train_step(src.data.train_loader.stream())["loss"]
    assert result.losses[0] == pytest.approx(first_src, rel=1e-6)


def test_checkpoint_of_another_model_is_refused_by_name(tmp_path):
    src = trainer(tmp_path / "src")
    src.train()
    other = trainer(tmp_path / "src", "--model.hidden_size=16", "--model.ffn_hidden_size=32")
    with pytest.raises(CheckpointError, match="hidden_size"):
        other.train()  # resume="auto" picks up src's checkpoint


def test_missing_init_from_names_the_option(tmp_path):
    from epochal.model import ConfigError

    tr = trainer(tmp_path / "x", f"--checkpoint.init_from={tmp_path / 'nowhere'}")
    with pytest.raises(ConfigError, match="checkpoint.init_from"):
        tr.train()
