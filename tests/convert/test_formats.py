"""``epochal.convert.formats``: one entry point over the checkpoint formats (detect, read, write)."""

from __future__ import annotations

import pytest
import torch

from epochal.convert.formats import (
    LoadedCheckpoint,
    detect_format,
    load_checkpoint,
    load_model_checkpoint,
    save_checkpoint,
)
from epochal.model.build import model_from_state
from tests.convert.hf_models import llama_like, ours


def test_detect_format(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "mg").mkdir()
    (tmp_path / "mg" / "latest_checkpointed_iteration.txt").write_text("3\n")
    (tmp_path / "it" / "mp_rank_00").mkdir(parents=True)
    (tmp_path / "run").mkdir()
    assert detect_format(tmp_path / "hf") == "hf"
    assert detect_format(tmp_path / "mg") == "megatron"
    assert detect_format(tmp_path / "it") == "megatron"
    assert detect_format(tmp_path / "run") == "epochal"
    with pytest.raises(FileNotFoundError, match="missing"):
        detect_format(tmp_path / "missing")


@pytest.mark.parametrize("target", ["hf", "megatron"])
def test_save_then_load_keeps_every_tensor(tmp_path, target):
    config = llama_like()
    model = ours(config, seed=3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for tensor in state.values():  # the vocabulary padding is not stored (it reads as zeros)
        if tensor.shape[0] == config.padded_vocab_size:
            tensor[config.vocab_size :] = 0
    ck = LoadedCheckpoint(config, state, "epochal", 5, {"bos": 1, "eos": 2})
    out = save_checkpoint(ck, tmp_path / target, target, source="test", tensor_parallel=2)
    assert detect_format(out) == target
    back = load_checkpoint(out)
    assert back.format == target
    assert set(back.state) == set(state)
    for name, tensor in state.items():
        torch.testing.assert_close(back.state[name], tensor, rtol=0, atol=0, msg=name)
    if target == "hf":
        assert back.extra == {"bos": 1, "eos": 2}
    else:
        assert back.step == 5  # the Megatron iteration defaults to the input's step


def test_load_model_checkpoint_runs_as_the_original(tmp_path):
    config = llama_like()
    model = ours(config, seed=4)
    ck = LoadedCheckpoint(config, dict(model.state_dict()), "epochal", 0, {"eos": 7})
    save_checkpoint(ck, tmp_path / "hf", "hf", source="test")
    loaded = load_model_checkpoint(tmp_path / "hf")
    assert loaded.tokenizer is None and loaded.eos_token_ids == (7,)
    tokens = torch.tensor([[3, 9, 27, 4]])
    with torch.no_grad():
        torch.testing.assert_close(
            model_from_state(loaded.config, loaded.state)(tokens)[..., :100],
            model(tokens)[..., :100],
        )


def test_model_config_is_refused_for_other_formats(tmp_path):
    config = llama_like()
    ck = LoadedCheckpoint(config, dict(ours(config).state_dict()), "epochal", 0)
    save_checkpoint(ck, tmp_path / "hf", "hf", source="test")
    with pytest.raises(ValueError, match="--model-config"):
        load_checkpoint(tmp_path / "hf", model_config=tmp_path / "fields.yaml")
    with pytest.raises(ValueError, match="--to 'onnx'"):
        save_checkpoint(ck, tmp_path / "x", "onnx", source="test")
