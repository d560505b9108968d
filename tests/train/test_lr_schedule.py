"""LR / WD schedule: hand-computed values and Megatron-Core's OptimizerParamScheduler as a peer."""

from __future__ import annotations

import math

import pytest
import torch

from epochal.train.optim.lr_schedule import OptimizerParamScheduler


class FakeOptimizer:
    def __init__(self) -> None:
        self.param_groups = [
            {"wd_mult": 1.0},
            {"wd_mult": 0.0},
            {"wd_mult": 1.0, "max_lr": 0.5, "min_lr": 0.05},
        ]


def make(style="cosine", **kw):
    args = dict(
        init_lr=0.0,
        max_lr=1.0,
        min_lr=0.1,
        lr_warmup_steps=10,
        lr_decay_steps=110,
        lr_decay_style=style,
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=110,
        wd_incr_style="constant",
    )
    args.update(kw)
    return OptimizerParamScheduler(FakeOptimizer(), **args)


def lr_at(sched, step):
    sched.num_steps = 0
    sched.step(step)
    return sched.optimizer.param_groups[0]["lr"]


def test_hand_computed_values():
    s = make("cosine")
    assert lr_at(s, 0) == 0.0
    assert lr_at(s, 5) == pytest.approx(0.5)
    assert lr_at(s, 10) == pytest.approx(1.0)
    assert lr_at(s, 60) == pytest.approx(0.55)  # halfway through cosine: (max + min) / 2
    assert lr_at(s, 110) == pytest.approx(0.1)
    assert lr_at(s, 500) == pytest.approx(0.1)
    lin = make("linear")
    assert lr_at(lin, 35) == pytest.approx(1.0 - 0.9 * 25 / 100)
    const = make("constant")
    assert lr_at(const, 80) == 1.0 and lr_at(const, 1000) == 1.0
    isr = make("inverse-square-root", lr_decay_steps=1000)
    assert lr_at(isr, 40) == pytest.approx(1.0 * math.sqrt(10 / 40))
    wsd = make("WSD", wsd_decay_steps=20, lr_wsd_decay_style="linear")
    assert lr_at(wsd, 90) == 1.0
    assert lr_at(wsd, 100) == pytest.approx(0.1 + 0.9 * 0.5)
    # group overrides and wd_mult
    s.num_steps = 0
    s.step(10)
    g = s.optimizer.param_groups
    assert (
        g[2]["lr"] == pytest.approx(0.5)
        and g[0]["weight_decay"] == 0.1
        and g[1]["weight_decay"] == 0.0
    )


def test_weight_decay_increment():
    s = make("cosine", start_wd=0.0, end_wd=0.2, wd_incr_steps=100, wd_incr_style="linear")
    s.num_steps = 25
    assert s.get_wd() == pytest.approx(0.05)
    s.wd_incr_style = "cosine"
    s.num_steps = 50
    assert s.get_wd() == pytest.approx(0.1)
    s.num_steps = 200
    assert s.get_wd() == 0.2


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(min_lr=-1.0), "min_lr"),
        (dict(max_lr=0.05), "max_lr"),
        (dict(lr_warmup_steps=110), "lr_warmup_steps"),
        (dict(lr_decay_steps=0), "lr_decay_steps"),
        (dict(lr_decay_style="step"), "lr_decay_style"),
        (dict(lr_decay_style="WSD"), "wsd_decay_steps"),
        (dict(start_wd=0.2, end_wd=0.1), "start_wd"),
        (dict(end_wd=0.3), "constant weight decay"),
    ],
)
def test_invalid_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


def test_state_dict_roundtrip():
    a = make("cosine")
    a.step(37)
    b = make("cosine")
    b.load_state_dict(a.state_dict())
    assert (
        b.num_steps == 37 and b.optimizer.param_groups[0]["lr"] == a.optimizer.param_groups[0]["lr"]
    )


@pytest.mark.peer
@pytest.mark.parametrize(
    "kw",
    [
        dict(lr_decay_style="cosine"),
        dict(lr_decay_style="linear", init_lr=0.01),
        dict(lr_decay_style="constant"),
        dict(lr_decay_style="inverse-square-root"),
        dict(lr_decay_style="cosine", lr_warmup_steps=0),
        dict(lr_decay_style="WSD", wsd_decay_steps=30, lr_wsd_decay_style="exponential"),
        dict(lr_decay_style="WSD", wsd_decay_steps=30, lr_wsd_decay_style="minus_sqrt"),
        dict(lr_decay_style="WSD", wsd_decay_steps=30, lr_wsd_decay_style="cosine"),
        dict(lr_decay_style="linear", start_wd=0.0, end_wd=0.1, wd_incr_style="linear"),
        dict(
            lr_decay_style="cosine",
            start_wd=0.01,
            end_wd=0.1,
            wd_incr_style="cosine",
            wd_incr_steps=50,
        ),
    ],
)
def test_matches_megatron_core(kw):
    MegatronScheduler = pytest.importorskip(
        "megatron.core.optimizer_param_scheduler"
    ).OptimizerParamScheduler

    args = dict(
        init_lr=0.0,
        max_lr=1.0,
        min_lr=0.1,
        lr_warmup_steps=10,
        lr_decay_steps=110,
        lr_decay_style="cosine",
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=110,
        wd_incr_style="constant",
    )
    args.update(kw)
    ours = OptimizerParamScheduler(FakeOptimizer(), **args)
    theirs = MegatronScheduler(FakeOptimizer(), **args)
    for _ in range(130):
        for g_ours, g_theirs in zip(ours.optimizer.param_groups, theirs.optimizer.param_groups):
            assert g_ours["lr"] == pytest.approx(g_theirs["lr"], rel=1e-12, abs=1e-15)
            assert g_ours["weight_decay"] == pytest.approx(
                g_theirs["weight_decay"], rel=1e-12, abs=1e-15
            )
        ours.step(1)
        theirs.step(1)
    # Megatron's state dict keys load into ours.
    resumed = OptimizerParamScheduler(FakeOptimizer(), **args)
    resumed.load_state_dict(theirs.state_dict())
    assert resumed.get_lr() == pytest.approx(theirs.get_lr({}))


def test_works_with_a_real_optimizer():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [p], "wd_mult": 0.0}], lr=1.0)
    s = OptimizerParamScheduler(
        opt,
        init_lr=0.0,
        max_lr=1e-3,
        min_lr=0.0,
        lr_warmup_steps=2,
        lr_decay_steps=10,
        lr_decay_style="linear",
        start_wd=0.1,
        end_wd=0.1,
        wd_incr_steps=10,
        wd_incr_style="constant",
    )
    s.step(1)
    assert (
        opt.param_groups[0]["lr"] == pytest.approx(5e-4)
        and opt.param_groups[0]["weight_decay"] == 0.0
    )
