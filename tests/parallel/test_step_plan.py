"""The step plan: Megatron's two loss forms, one normalisation, and its refusals."""

from __future__ import annotations

import pytest
import torch

from epochal.parallel.step_plan import StepPlan, split_loss_output


def test_a_summed_loss_becomes_the_micro_batch_token_mean_and_is_logged() -> None:
    plan = StepPlan.training_step(2, divisor=4)
    out = split_loss_output((torch.tensor(6.0), torch.tensor(4.0), {}))
    loss = plan.micro_batch_loss(out)
    assert loss.item() == 1.5 and out.logged["lm loss"].item() == 1.5
    assert plan.divided(loss).item() == 1.5 / 4


def test_a_global_token_count_weighs_each_sum_by_micro_batches_over_tokens() -> None:
    # 2 micro-batches here, 3 data-parallel ranks: M = 6; N = 40 loss tokens in the global batch
    plan = StepPlan.training_step(2, divisor=2, global_micro_batches=6, loss_tokens=40)
    assert plan.token_weight == 6 / 40
    total = torch.tensor(10.0)
    loss = plan.micro_batch_loss(split_loss_output((total, torch.tensor(7.0), {"x": 1.0})))
    assert torch.equal(loss, total * (6 / 40))
    assert torch.equal(plan.divided(loss), loss / 2)  # the data-parallel average divides by 3


def test_a_mean_form_passes_unchanged_and_a_step_logging_lm_loss_keeps_its_own() -> None:
    plan = StepPlan.training_step(1, divisor=1)
    value = torch.tensor(2.5)
    assert torch.equal(plan.micro_batch_loss(split_loss_output((value, {"lm loss": 9.0}))), value)
    out = split_loss_output((torch.tensor(4.0), torch.tensor(2.0), {"lm loss": 9.0}))
    plan.micro_batch_loss(out)
    assert out.logged["lm loss"] == 9.0


def test_a_global_token_mean_refuses_a_loss_that_is_already_a_mean() -> None:
    plan = StepPlan.training_step(1, divisor=1, loss_tokens=10)
    with pytest.raises(ValueError, match="loss_sum, count, logged"):
        plan.micro_batch_loss(split_loss_output((torch.tensor(1.0), {})))


def test_the_loss_scale_scales_the_backward_and_the_balance_losses_only_in_training() -> None:
    plan = StepPlan.training_step(4, divisor=8, loss_scale=1024.0, seeds=[1, 2, 3, 4])
    assert (plan.backward_scale, plan.aux_grad_factor, plan.seeds) == (1024.0, 128.0, (1, 2, 3, 4))
    assert StepPlan.evaluation(4).backward_scale == 1.0


@pytest.mark.parametrize(
    "result, match",
    [
        (torch.tensor(1.0), "must return"),
        ((torch.ones(2), {}), "one-element tensor"),
        ((torch.tensor(1.0), 3, {}), "loss count"),
        ((torch.tensor(1.0), {"x": torch.ones(2)}), "logged value 'x'"),
        ((torch.tensor(1.0), {3: 1.0}), "names must be strings"),
    ],
)
def test_bad_loss_results_are_refused_by_name(result, match) -> None:
    with pytest.raises(ValueError, match=match):
        split_loss_output(result)


def test_a_plan_checks_its_counts() -> None:
    with pytest.raises(ValueError, match="at least one micro-batch"):
        StepPlan.training_step(0, divisor=1)
    with pytest.raises(ValueError, match="2 dropout seeds for 3 micro-batches"):
        StepPlan.training_step(3, divisor=3, seeds=[1, 2])
