"""Weights do not depend on the device a model is built on (issue 25: CUDA builds crashed).

The trainer builds its model under ``with torch.device(device)``. Every initial value
is drawn on the CPU from a CPU generator and copied to the parameter, so a default
device other than the CPU must neither break the draw nor change the values. On a
CPU-only machine the ``meta`` default device plays the foreign device: before the
fix, values drawn under it were ``meta`` tensors (no data) and the copy failed.
"""

from __future__ import annotations

import pytest
import torch

from epochal.model import ModelConfig, build_model
from epochal.model.init import initial_value

_BASE = dict(
    vocab_size=60,
    hidden_size=32,
    num_layers=2,
    num_attention_heads=4,
    max_position_embeddings=16,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)
CONFIGS = {
    "gpt-rope": dict(position_embedding_type="rope"),
    "gpt-alibi": dict(position_embedding_type="alibi"),
    "gpt-learned": dict(position_embedding_type="learned_absolute"),
    "bert": dict(type="bert", num_tokentypes=2),
    "t5": dict(type="t5", output_bias=True),
}


def _config(name: str) -> ModelConfig:
    return ModelConfig(**{**_BASE, **CONFIGS[name]})


def _assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key].cpu(), sb[key].cpu()), key
    for (name, x), y in zip(a.named_buffers(), b.buffers()):
        assert torch.equal(x.cpu(), y.cpu()), name


def test_initial_value_is_drawn_on_the_cpu_under_any_default_device() -> None:
    cfg = _config("gpt-rope")
    ref = initial_value(cfg, "layers.0.attention.wq.weight", (32, 32), seed=3)
    ones = initial_value(cfg, "layers.0.attention_norm.weight", (32,), seed=3)
    with torch.device("meta"):
        got = initial_value(cfg, "layers.0.attention.wq.weight", (32, 32), seed=3)
        got_ones = initial_value(cfg, "layers.0.attention_norm.weight", (32,), seed=3)
    assert got.device.type == "cpu" and got_ones.device.type == "cpu"
    assert torch.equal(got, ref) and torch.equal(got_ones, ones)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_initializing_under_a_foreign_default_device_gives_the_cpu_weights(name: str) -> None:
    cfg = _config(name)
    reference = build_model(cfg, seed=11)
    with torch.device("meta"):  # the default device is not the parameters' device
        model = build_model(cfg, seed=11)
        model.to_empty(device="cpu")
        model.init_weights(seed=11)
    _assert_same_model(reference, model)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_building_on_cuda_gives_the_cpu_weights(name: str) -> None:
    cfg = _config(name)
    reference = build_model(cfg, seed=11)
    with torch.device("cuda"):
        model = build_model(cfg, seed=11)
    assert next(model.parameters()).device.type == "cuda"
    _assert_same_model(reference, model)
