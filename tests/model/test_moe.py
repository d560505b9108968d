"""The mixture-of-experts MLP: routing, the dense limit, the auxiliary losses, the config's checks."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from epochal.model import build_model
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.layers.mlp import MLP
from epochal.model.layers.moe import (
    MoEMLP,
    pop_moe_stats,
    route,
    set_moe_aux_grad_factor,
    switch_aux_loss,
)


def _config(**kw) -> ModelConfig:
    base = dict(
        vocab_size=96,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        position_embedding_type="rope",
        normalization="RMSNorm",
        activation="swiglu",
        ffn_hidden_size=96,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_experts=4,
        moe_router_topk=2,
    )
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_one_expert_top1_equals_the_dense_mlp_exactly(activation):
    cfg = _config(activation=activation, num_experts=1, moe_router_topk=1)
    moe = MoEMLP(cfg)
    dense = MLP(cfg)
    torch.manual_seed(0)
    for p in moe.parameters():
        p.data.normal_(0, 0.1)
    dense.load_state_dict(
        {
            k.removeprefix("experts.0."): v
            for k, v in moe.state_dict().items()
            if k.startswith("experts.0.")
        }
    )
    x = torch.randn(2, 8, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, ref = moe(x), dense(x2)
    assert torch.equal(out, ref)
    out.square().sum().backward()
    ref.square().sum().backward()
    assert torch.equal(x.grad, x2.grad)
    for name, p in dense.named_parameters():
        assert torch.equal(moe.experts[0].get_parameter(name).grad, p.grad), name


def test_whole_model_with_one_expert_equals_the_dense_model():
    dense_cfg = _config(num_experts=None, ffn_hidden_size=96)
    moe_cfg = _config(num_experts=1, moe_router_topk=1, ffn_hidden_size=96)
    dense, moe = build_model(dense_cfg, seed=3), build_model(moe_cfg, seed=3)
    state = {}
    for k, v in dense.state_dict().items():
        state[k.replace(".mlp.", ".mlp.experts.0.")] = v
    for k, v in moe.state_dict().items():
        if k.endswith("router.weight"):
            state[k] = v
    moe.load_state_dict(state)
    tokens = torch.randint(0, 96, (2, 16))
    assert torch.equal(moe(tokens), dense(tokens))


def test_aux_loss_matches_transformers_switch_loss():
    torch.manual_seed(1)
    logits = torch.randn(12, 4)
    for k in (1, 2, 3):
        weights, experts, keep, probs = route(logits, k)
        counts = torch.bincount(experts.reshape(-1), minlength=4)
        ours = switch_aux_loss(probs, counts, k)
        # transformers' form is not normalised by top-k: k times Megatron's
        peer = load_balancing_loss_func((logits,), num_experts=4, top_k=k)
        torch.testing.assert_close(ours * k, peer, rtol=1e-6, atol=1e-7)
    balanced = torch.zeros(8, 4)
    _, experts, _, probs = route(balanced + torch.eye(4).repeat(2, 1) * 1e-3, 1)
    assert switch_aux_loss(
        probs, torch.bincount(experts.reshape(-1), minlength=4), 1
    ) == pytest.approx(1.0, rel=1e-3)


def test_routing_renormalises_unless_pre_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    w, e, _, probs = route(logits, 2)
    assert e.tolist() == [[0, 1]]
    torch.testing.assert_close(w.sum(-1), torch.ones(1))
    w2, _, _, _ = route(logits, 2, pre_softmax=True)
    torch.testing.assert_close(w2, probs[:, :2])


def test_capacity_drops_lowest_probability_assignments():
    logits = torch.tensor([[5.0, 0.0], [4.0, 0.0], [3.0, 0.0], [0.0, 1.0]])
    w, e, keep, _ = route(logits, 1, capacity_factor=1.0)  # capacity ceil(4*1/2*1)=2
    assert keep[:, 0].tolist() == [True, True, False, True]
    assert w[2, 0] == 0


def test_aux_and_z_losses_join_the_gradient_scaled_and_are_recorded():
    cfg = _config(moe_aux_loss_coeff=0.5, moe_z_loss_coeff=0.25)
    torch.manual_seed(0)
    layer = MoEMLP(cfg, layer_id=3)
    for p in layer.parameters():
        p.data.normal_(0, 0.2)
    x = torch.randn(2, 8, 64)
    set_moe_aux_grad_factor(layer, 0.5)
    layer(x).sum().backward()
    got = layer.router.weight.grad.clone()
    layer.zero_grad()
    # by hand: the main objective plus the coefficients' losses, the latter scaled by 0.5
    tokens = x.reshape(-1, 64)
    logits = layer.router(tokens)
    _, experts, _, probs = route(logits, 2)
    counts = torch.bincount(experts.reshape(-1), minlength=4)
    aux = switch_aux_loss(probs, counts, 2)
    z = torch.logsumexp(logits, -1).square().mean()
    layer.aux_grad_factor = 0.0
    (layer(x).sum() + 0.5 * (0.5 * aux + 0.25 * z)).backward()
    torch.testing.assert_close(got, layer.router.weight.grad)
    stats = pop_moe_stats(layer)
    assert set(stats) >= {"load_balancing_loss", "z_loss", "load_balancing_loss/layer_3"}
    torch.testing.assert_close(stats["load_balancing_loss"], aux.detach())
    fractions = [float(stats[f"tokens_per_expert/layer_3/expert_{e}"]) for e in range(4)]
    assert math.isclose(sum(fractions), 1.0, rel_tol=1e-6)
    assert pop_moe_stats(layer) == {}


def test_shared_expert_gate_and_layer_frequency():
    cfg = _config(
        moe_shared_expert_intermediate_size=32,
        moe_shared_expert_gate=True,
        moe_layer_freq=[0, 1],
    )
    model = build_model(cfg)
    names = dict(model.named_parameters())
    assert "layers.0.mlp.w1.weight" in names
    assert names["layers.1.mlp.router.weight"].shape == (4, 64)
    assert names["layers.1.mlp.experts.3.w2.weight"].shape == (64, 96)
    assert names["layers.1.mlp.shared_expert.w1.weight"].shape == (32, 64)
    assert names["layers.1.mlp.shared_expert_gate.weight"].shape == (1, 64)
    # experts' output projections use the scaled init, as the dense w2
    std = names["layers.1.mlp.experts.0.w2.weight"].std().item()
    assert std < 0.02 / math.sqrt(4) * 1.3
    assert cfg.to_dict()["num_experts"] == 4
    assert "num_experts" not in _config(num_experts=None).to_dict()


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"moe_router_topk": 5}, "moe_router_topk"),
        ({"num_experts": 0}, "num_experts"),
        ({"moe_aux_loss_coeff": -1.0}, "moe_aux_loss_coeff"),
        ({"moe_expert_capacity_factor": 0.0}, "moe_expert_capacity_factor"),
        ({"moe_layer_freq": [1]}, "moe_layer_freq"),
        ({"moe_layer_freq": 0}, "moe_layer_freq"),
        ({"moe_shared_expert_gate": True}, "moe_shared_expert_gate"),
        ({"num_experts": None, "moe_ffn_hidden_size": 32}, "moe_ffn_hidden_size"),
    ],
)
def test_invalid_moe_options_name_the_option(kw, option):
    with pytest.raises(ConfigError) as info:
        _config(**kw)
    assert info.value.option == option


def test_generate_on_a_moe_model_matches_the_full_forward():
    from epochal.model import generate

    cfg = _config(moe_shared_expert_intermediate_size=32, moe_shared_expert_gate=True)
    model = build_model(cfg, seed=1).eval()
    for p in model.parameters():  # larger weights: routing differs between tokens
        p.data.mul_(5)
    prompts = [[5, 17, 3, 9], [9, 9]]
    out = generate(model, prompts, max_new_tokens=6)
    for prompt, new in zip(prompts, out.tokens):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(6):  # greedy without a cache: the whole sequence each time
                seq.append(int(model(torch.tensor([seq]))[0, -1, :96].argmax()))
        assert list(new) == seq[len(prompt) :]


def test_flops_count_the_active_experts_only():
    from epochal.model.flops import matmul_parameters

    dense = _config(num_experts=None, ffn_hidden_size=96)
    # one expert of the dense width, top-1: the dense count plus the router
    one = _config(num_experts=1, moe_router_topk=1, moe_ffn_hidden_size=96)
    assert matmul_parameters(one) == matmul_parameters(dense) + 2 * 64 * 1
    # eight experts, top-2: twice the dense MLP, not eight times
    eight = _config(num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=96)
    mlp = 3 * 64 * 96
    assert matmul_parameters(eight) == matmul_parameters(dense) + 2 * (mlp + 64 * 8)
