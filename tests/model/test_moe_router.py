"""DeepSeek-V3's router: sigmoid scores, the balancing bias, group-limited routing, scaling.

Checked against the peers themselves: Megatron-Core's ``topk_routing_with_score_function``,
``compute_routing_scores_for_aux_loss`` and ``get_updated_expert_bias`` (pure functions
that run on the CPU), and transformers' ``DeepseekV3MoE`` block (router, experts and shared
expert) with our weights copied in.
"""

from __future__ import annotations

import pytest
import torch
from megatron.core.transformer.moe import moe_utils
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

from epochal.model.config import ConfigError, ModelConfig
from epochal.model.layers.moe import MoEMLP, reset_expert_counts, update_expert_bias
from epochal.model.layers.router import route
from tests.model.test_moe import _config as moe_config

E, K = 16, 4


def _dense(weights: torch.Tensor, experts: torch.Tensor, e: int) -> torch.Tensor:
    """``[T, k]`` weights of chosen experts -> ``[T, E]`` (zeros elsewhere)."""
    return torch.zeros(weights.shape[0], e, dtype=weights.dtype).scatter(1, experts, weights)


CASES = {
    "sigmoid": dict(score_function="sigmoid"),
    "sigmoid-bias-groups-scaled": dict(
        score_function="sigmoid", bias=True, num_groups=4, group_topk=2, scaling_factor=2.5
    ),
    "softmax-groups": dict(score_function="softmax", num_groups=4, group_topk=2),
    "softmax-pre-groups": dict(
        score_function="softmax", pre_softmax=True, num_groups=8, group_topk=4
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_routing_equals_megatron_cores(name):
    case = dict(CASES[name])
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, E, generator=g)
    bias = torch.randn(E, generator=g) * 0.05 if case.pop("bias", False) else None
    score = case["score_function"]
    weights, experts, keep, probs = route(logits, K, expert_bias=bias, **case)
    theirs, routing_map = moe_utils.topk_routing_with_score_function(
        logits,
        K,
        use_pre_softmax=case.get("pre_softmax", False),
        num_groups=case.get("num_groups"),
        group_topk=case.get("group_topk"),
        scaling_factor=case.get("scaling_factor"),
        score_function=score,
        expert_bias=bias,
    )
    ours = _dense(weights, experts, E)
    assert torch.equal(ours != 0, routing_map)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert keep.all()
    _, aux_scores = moe_utils.compute_routing_scores_for_aux_loss(logits, K, score)
    torch.testing.assert_close(probs, aux_scores, rtol=1e-6, atol=1e-7)


def test_the_bias_moves_the_choice_not_the_weights():
    logits = torch.zeros(2, 4)
    logits[:, 0] = 1.0  # expert 0 scores highest
    bias = torch.tensor([-1.0, 0.0, 0.0, 0.5])
    weights, experts, _, _ = route(logits, 1, score_function="sigmoid", expert_bias=bias)
    assert experts.flatten().tolist() == [3, 3]  # chosen on score + bias
    assert torch.allclose(weights, torch.sigmoid(torch.tensor(0.0)).expand(2, 1))  # its score


def test_the_bias_update_equals_megatron_cores(monkeypatch):
    g = torch.Generator().manual_seed(5)
    counts = torch.randint(0, 40, (3, E), generator=g).float()
    counts[0, :4] = counts[0, 4:8]  # ties with the mean are left alone
    bias = torch.randn(3, E, generator=g) * 0.01
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    monkeypatch.setattr(
        moe_utils.parallel_state, "get_tensor_and_data_parallel_group", lambda **k: None
    )
    theirs = moe_utils.get_updated_expert_bias(counts.clone(), bias.clone(), 1e-3)
    layers = [MoEMLP(_config()) for _ in range(3)]
    for layer, c, b in zip(layers, counts, bias, strict=True):
        layer.expert_bias.copy_(b)
        layer.expert_counts.copy_(c)
    update_expert_bias(layers)
    assert torch.equal(torch.stack([m.expert_bias for m in layers]), theirs)
    assert all(not m.expert_counts.any() for m in layers)  # cleared for the next step


def test_a_skipped_step_keeps_the_bias_and_clears_the_counts():
    layer = MoEMLP(_config())
    layer.expert_counts.fill_(3.0)
    layer.expert_counts[0] = 9.0
    update_expert_bias([layer], apply=False)
    assert not layer.expert_bias.any() and not layer.expert_counts.any()
    layer.train()
    layer(torch.randn(5, 64))
    assert layer.expert_counts.sum() == 5 * K  # training forwards count their choices
    reset_expert_counts(layer)
    layer.eval()
    layer(torch.randn(5, 64))
    assert not layer.expert_counts.any()  # evaluations do not


#: DeepSeek-V3's routing on test_moe's tiny layer: E experts, top-K of the best 2 of 4 groups
DEEPSEEK = dict(
    num_experts=E,
    moe_router_topk=K,
    moe_ffn_hidden_size=32,
    moe_shared_expert_intermediate_size=64,
    moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True,
    moe_router_num_groups=4,
    moe_router_group_topk=2,
    moe_router_topk_scaling_factor=2.5,
)


def _config(**kw) -> ModelConfig:
    return moe_config(**{**DEEPSEEK, **kw})


def test_the_layer_equals_transformers_deepseek_v3_moe():
    torch.manual_seed(0)
    cfg = _config(moe_router_topk=8, moe_router_group_topk=4)  # top-2 of each group: theirs
    ours = MoEMLP(cfg)
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ours.expert_bias.normal_(std=0.05)
    hf = DeepseekV3Config(
        hidden_size=64,
        moe_intermediate_size=32,
        n_routed_experts=E,
        n_shared_experts=2,
        num_experts_per_tok=8,
        n_group=4,
        topk_group=4,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        hidden_act="silu",
    )
    theirs = DeepseekV3MoE(hf).eval()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.router.weight)
        theirs.gate.e_score_correction_bias.copy_(ours.expert_bias)
        for e, expert in enumerate(ours.experts):
            theirs.experts.gate_up_proj[e].copy_(torch.cat([expert.w1.weight, expert.w3.weight]))
            theirs.experts.down_proj[e].copy_(expert.w2.weight)
        shared = ours.shared_expert
        theirs.shared_experts.gate_proj.weight.copy_(shared.w1.weight)
        theirs.shared_experts.up_proj.weight.copy_(shared.w3.weight)
        theirs.shared_experts.down_proj.weight.copy_(shared.w2.weight)
    x = torch.randn(2, 24, 64)
    ours.eval()
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kw", "option"),
    [
        ({"moe_router_score_function": "softmax"}, "moe_router_enable_expert_bias"),
        ({"moe_router_score_function": "tanh"}, "moe_router_score_function"),
        ({"moe_router_num_groups": None}, "moe_router_num_groups"),
        ({"moe_router_num_groups": 3}, "moe_router_num_groups"),
        ({"moe_router_group_topk": 5}, "moe_router_group_topk"),
        ({"moe_router_topk": 1}, "moe_router_group_topk"),  # fewer experts than groups
        ({"moe_router_bias_update_rate": 0.0}, "moe_router_bias_update_rate"),
        ({"moe_router_pre_softmax": True}, "moe_router_pre_softmax"),
    ],
)
def test_invalid_router_options_name_the_option(kw, option):
    with pytest.raises(ConfigError) as info:
        _config(**kw)
    assert info.value.option == option


def test_the_sequence_wise_loss_equals_megatron_cores():
    torch.manual_seed(1)
    layer = MoEMLP(_config(moe_router_load_balancing_type="seq_aux_loss"))
    b, s = 3, 10
    x = torch.randn(b, s, 64)
    layer(x)
    logits = layer.router(x.reshape(-1, 64))
    routing, _ = moe_utils.topk_routing_with_score_function(
        logits,
        K,
        num_groups=4,
        group_topk=2,
        scaling_factor=2.5,
        score_function="sigmoid",
        expert_bias=layer.expert_bias,
    )
    _, scores = moe_utils.compute_routing_scores_for_aux_loss(logits, K, "sigmoid")
    # Megatron-Core's layout is [s, b]: the sequences side by side as b * E "experts"
    seq_first = scores.view(b, s, E).transpose(0, 1).reshape(s, b * E)
    chosen = (routing != 0).view(b, s, E).transpose(0, 1).reshape(s, b * E)
    theirs = moe_utils.switch_load_balancing_loss_func(seq_first, chosen.sum(0), s, K, E, 1.0) / b
    torch.testing.assert_close(layer.last_stats["aux"], theirs, rtol=1e-6, atol=0)
    layer(x[:1])
    one = layer.last_stats["aux"]
    assert not torch.allclose(theirs, one)  # a mean of per-sequence losses


@pytest.mark.parametrize("balance", ["aux_loss", "seq_aux_loss"])
def test_two_context_parallel_ranks_record_one_processs_losses(balance):
    # two ranks holding the same tokens (a token_sum that doubles): the records are one
    # process's over the sequences holding those tokens twice
    torch.manual_seed(2)
    layer = MoEMLP(_config(moe_router_load_balancing_type=balance, moe_aux_loss_coeff=1.0))
    x = torch.randn(2, 8, 64)
    layer(torch.cat([x, x], dim=1))
    whole = dict(layer.last_stats)
    layer.token_sum = lambda t: 2 * t
    layer(x)
    for key in ("aux", "z", "tokens"):
        torch.testing.assert_close(layer.last_stats[key], whole[key], rtol=1e-6, atol=0)
