"""Grouped experts (``model.moe_grouped_gemm``): one grouped GEMM per projection for all experts.

The grouped path is held to the per-expert loop: the same forward bits and the same weight
gradients bit for bit, the tokens' gradients within float rounding (one scatter instead of
one zero-filled gradient per expert); and its own loop fallback (where ``grouped_mm`` is
missing) to its bits. Dropless and with capacity; gated and plain activations.
"""

from __future__ import annotations

import pytest
import torch

from epochal.model import build_model
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.layers import grouped_experts
from epochal.model.layers.moe import MoEMLP
from tests.model.test_moe import _config as moe_config


def _config(**kw) -> ModelConfig:
    """test_moe's tiny layer with 16 experts, top-8."""
    return moe_config(**{"num_experts": 16, "moe_router_topk": 8, "moe_ffn_hidden_size": 32, **kw})


def _run(layer: MoEMLP, x: torch.Tensor, grouped: bool):
    layer.grouped_gemm = grouped
    layer.zero_grad()
    x = x.detach().clone().requires_grad_()
    out = layer(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("capacity", [None, 1.0])
def test_grouped_experts_compute_the_loops_bits(activation, capacity, monkeypatch):
    torch.manual_seed(0)
    layer = MoEMLP(_config(activation=activation, moe_expert_capacity_factor=capacity))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    x = torch.randn(2, 40, 64)
    loop = _run(layer, x, grouped=False)
    grouped = _run(layer, x, grouped=True)
    assert torch.equal(grouped[0], loop[0])  # the forward's bits
    assert all(torch.equal(a, b) for a, b in zip(grouped[2], loop[2], strict=True))
    torch.testing.assert_close(grouped[1], loop[1], rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(grouped_experts, "_GROUPED_MM", None)  # the loop fallback
    fallback = _run(layer, x, grouped=True)
    assert torch.equal(fallback[0], grouped[0]) and torch.equal(fallback[1], grouped[1])
    assert all(torch.equal(a, b) for a, b in zip(fallback[2], grouped[2], strict=True))


def test_a_grouped_model_gives_the_loops_logits():
    loop = build_model(_config(), seed=3)
    grouped = build_model(_config(moe_grouped_gemm=True), seed=3)
    tokens = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(4))
    assert torch.equal(grouped(tokens), loop(tokens))
    assert grouped.state_dict().keys() == loop.state_dict().keys()  # the same checkpoint names


def test_where_grouped_experts_do_not_apply_the_option_is_named():
    from epochal.parallel.canonical_plan import canonical_refusal
    from epochal.parallel.config import ParallelConfig
    from epochal.parallel.dims import ParallelDims

    with pytest.raises(ConfigError) as info:
        _config(moe_grouped_gemm=True, add_bias_linear=True)
    assert info.value.option == "moe_grouped_gemm"
    cfg = _config(moe_grouped_gemm=True)
    assert "moe_grouped_gemm" in canonical_refusal(cfg, 8)
    for layout in ({"tensor_parallel": 2}, {"expert_parallel": 2, "data_parallel": 2}):
        pc = ParallelConfig(**layout)
        dims = ParallelDims.from_config(pc, 2)
        with pytest.raises(ConfigError) as info:  # before any process starts (check_layout)
            dims.validate(cfg, micro_batch_size=1, global_batch_size=4, seq_length=32, config=pc)
        assert info.value.option == "model.moe_grouped_gemm"
