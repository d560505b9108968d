"""AdamW parameter groups (Megatron's no-WD rule), gradient clipping, the optimizers container."""

from __future__ import annotations

import copy

import torch

from epochal.model import GPTModel, ModelConfig
from epochal.train.optim.optimizer import (
    OptimizersContainer,
    build_adamw,
    clip_grad_norm,
    param_groups,
)


def model(**kw):
    cfg = dict(
        vocab_size=40,
        hidden_size=16,
        num_layers=2,
        num_attention_heads=2,
        max_position_embeddings=8,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    cfg.update(kw)
    return GPTModel(ModelConfig(**cfg))


def test_megatron_param_groups():
    m = model()
    decay, no_decay = param_groups([m])
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert "tok_embeddings.weight" in decayed and "pos_embeddings.weight" in decayed
    assert "layers.0.attention.wq.weight" in decayed and "layers.1.mlp.fc2.weight" in decayed
    assert (
        "layers.0.attention.wq.bias" in not_decayed
        and "layers.0.attention_norm.weight" in not_decayed
    )
    assert "norm.weight" in not_decayed and "norm.bias" in not_decayed
    assert decayed.isdisjoint(not_decayed)
    assert len(decay["params"]) + len(no_decay["params"]) == len(
        list(m.parameters())
    )  # tied weight once
    assert decay["wd_mult"] == 1.0 and no_decay["wd_mult"] == 0.0
    opt = build_adamw([m], lr=1e-3, weight_decay=0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]


def test_clip_grad_norm_is_global():
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(4))
    a.grad = torch.tensor([3.0, 0.0, 0.0])
    b.grad = torch.tensor([0.0, 4.0, 0.0, 0.0])
    norm = clip_grad_norm([a, b], max_norm=1.0)
    assert norm.item() == 5.0
    total = torch.cat([a.grad, b.grad]).norm().item()
    assert abs(total - 1.0) < 1e-5
    a.grad = torch.tensor([3.0, 0.0, 0.0])
    b.grad = torch.tensor([0.0, 4.0, 0.0, 0.0])
    assert clip_grad_norm([a, b], max_norm=0.0).item() == 5.0  # measure only
    assert a.grad[0].item() == 3.0
    # a non-finite norm leaves the gradients as they are (the trainer skips the step)
    b.grad = torch.tensor([float("inf"), 4.0, 0.0, 0.0])
    assert clip_grad_norm([a, b], max_norm=1.0).item() == float("inf")
    assert a.grad.tolist() == [3.0, 0.0, 0.0] and b.grad[1].item() == 4.0


def test_container_state_roundtrip_is_fqn_keyed():
    m = model()
    opt = OptimizersContainer([m], lambda part: build_adamw([part], lr=1e-2, weight_decay=0.1))
    m(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())  # as if read from disk (no shared tensors)
    assert "state.layers.1.attention.wq.weight.exp_avg" in sd
    m2 = model()
    m2.load_state_dict(m.state_dict())
    opt2 = OptimizersContainer([m2], lambda part: build_adamw([part], lr=1e-2, weight_decay=0.1))
    opt2.load_state_dict(sd)
    for p in (m, m2):
        p.zero_grad()
        p(torch.ones(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    opt2.step()
    for p1, p2 in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert len(opt.param_groups) == 2 and len(opt.parameters()) == len(list(m.parameters()))
