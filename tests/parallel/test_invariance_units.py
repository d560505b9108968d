"""The pieces of layout invariance in one process: keyed dropout, the exact norm, the global order."""

from __future__ import annotations

import math

import pytest
import torch

from epochal.model import GPTModel
from epochal.parallel.dropout_keys import (
    DROPOUT_SEED_KWARG,
    install_keyed_dropout,
    micro_batch_seed,
    preserved_rng,
    seed_micro_batch,
    step_seeds,
)
from epochal.parallel.exact_norm import (
    clip_grad_norm_exact,
    exact_grad_norm,
    exact_sum,
    row_square_sums,
)
from epochal.parallel.global_order import _interleave, sequential_sum
from epochal.parallel.pipeline import split_stage_module
from epochal.parallel.recompute import apply_recompute
from epochal.train.device import use_deterministic_kernels
from tests.parallel.harness import tiny_config

CPU = torch.device("cpu")


def tiny_gpt(layers: int = 3) -> GPTModel:
    config = tiny_config(
        vocab_size=64,
        num_layers=layers,
        max_position_embeddings=16,
        hidden_dropout=0.3,
        attention_dropout=0.3,
    )
    return GPTModel(config, seed=0)


TOKENS = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(3))


def keyed_forward(model: torch.nn.Module, seed: int) -> torch.Tensor:
    seed_micro_batch(seed, CPU)
    return model(TOKENS)


def test_keyed_masks_depend_only_on_the_micro_batch_seed():
    model = tiny_gpt()
    assert install_keyed_dropout(model)
    first = keyed_forward(model, 11)
    torch.rand(1000)  # whatever ran before does not matter
    assert torch.equal(keyed_forward(model, 11), first)
    assert not torch.equal(keyed_forward(model, 12), first)
    model.eval()
    assert torch.equal(keyed_forward(model, 11), keyed_forward(model, 12))  # no dropout


def test_pipeline_stages_draw_the_masks_of_the_whole_model():
    whole = tiny_gpt()
    first = split_stage_module(whole, range(0, 1), is_first=True, is_last=False)
    last = split_stage_module(whole, range(1, 3), is_first=False, is_last=True)
    for module in (whole, first, last):
        install_keyed_dropout(module)
    want = keyed_forward(whole, 5)
    seed = torch.tensor([5])
    got = last(first(TOKENS, **{DROPOUT_SEED_KWARG: seed}), **{DROPOUT_SEED_KWARG: seed})
    assert torch.equal(got, want)


@pytest.mark.parametrize("method,n", [("uniform", 1), ("uniform", 2)])
def test_recompute_replays_the_keyed_masks(method, n):
    plain, wrapped = tiny_gpt(), tiny_gpt()
    apply_recompute(wrapped.layers, "full", method=method, num_layers=n)
    for model in (plain, wrapped):
        install_keyed_dropout(model)
    losses = []
    for model in (plain, wrapped):
        loss = keyed_forward(model, 9).float().square().mean()
        torch.rand(10)  # the backward's recomputation must not depend on the stream
        loss.backward()
        losses.append(loss)
    assert torch.equal(losses[0], losses[1])
    for a, b in zip(plain.parameters(), wrapped.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_a_keyed_step_leaves_the_global_stream_alone():
    model = tiny_gpt()
    install_keyed_dropout(model)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    with preserved_rng(CPU):
        keyed_forward(model, 4)
    assert torch.equal(torch.get_rng_state(), before)


def test_step_seeds_follow_the_global_micro_batch():
    one = step_seeds(7, 3, 4)  # one process, four micro-batches, the fourth step
    assert one == [micro_batch_seed(7, 3, k) for k in range(4)]
    assert step_seeds(7, 3, 2, dp_rank=0, dp_size=2) == one[0::2]
    assert step_seeds(7, 3, 2, dp_rank=1, dp_size=2) == one[1::2]
    assert step_seeds(7, 3, 1, dp_rank=3, dp_size=4) == one[3:]
    assert len(set(one + step_seeds(7, 4, 4))) == 8 and all(0 <= s < 2**63 for s in one)


def test_the_global_order_interleaves_the_ranks():
    assert _interleave([[0, 2, 4], [1, 3, 5]]) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="different numbers of micro-batches"):
        _interleave([[0, 2], [1]])
    values = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float32)
    want = torch.zeros(())
    for v in values:
        want += v
    assert torch.equal(sequential_sum(values), want)


def _params(tensors: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    out = []
    for t in tensors:
        p = torch.nn.Parameter(torch.zeros_like(t))
        p.grad = t.clone()
        out.append(p)
    return out


def test_the_exact_norm_does_not_depend_on_how_rows_are_split():
    g = torch.Generator().manual_seed(0)
    grads = [
        torch.randn(3, 33000, generator=g) * 1e-3,  # long rows: never reduced by several threads
        torch.randn(5, 3, generator=g),
        torch.randn(1, 33000, generator=g),
        torch.randn(9, generator=g) * 1e4,
    ]
    whole = exact_grad_norm(_params(grads))
    pieces = [piece for t in grads for piece in t.split(2)]  # FSDP-like row shards
    assert torch.equal(exact_grad_norm(_params(pieces[::-1])), whole)
    true = torch.cat([t.double().flatten() for t in grads]).square().sum().sqrt()
    assert whole.item() == pytest.approx(true.item(), rel=1e-6)
    assert torch.equal(row_square_sums(torch.tensor(3.0)), torch.tensor([9.0], dtype=torch.float64))


def test_the_exact_sum_is_fsums_correctly_rounded_sum_in_any_order():
    g = torch.Generator().manual_seed(2)
    scales = torch.tensor(10.0, dtype=torch.float64) ** torch.randint(
        -300, 300, (500,), generator=g
    )
    values = torch.rand(500, dtype=torch.float64, generator=g) * scales
    values = torch.cat([values, torch.tensor([0.0, 5e-324, 1e300], dtype=torch.float64)])
    want = math.fsum(values.tolist())
    assert exact_sum(values) == want
    assert exact_sum(values[torch.randperm(len(values), generator=g)]) == want
    assert exact_sum(values[:0]) == 0.0
    assert exact_sum(torch.tensor([1e308, 1e308], dtype=torch.float64)) == math.inf


def test_exact_clipping_scales_like_torch_and_skips_non_finite_norms():
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(4, 5, generator=g), torch.randn(6, generator=g)]
    ours, theirs = _params(grads), _params(grads)
    norm = clip_grad_norm_exact(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6)
    for a, b in zip(ours, theirs):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6)
    bad = _params([torch.tensor([1.0, float("inf")]), torch.tensor([2.0])])
    assert clip_grad_norm_exact(bad, 0.5).item() == math.inf
    assert bad[1].grad.item() == 2.0  # not scaled
    assert math.isnan(exact_grad_norm(_params([torch.tensor([float("nan")])])).item())


def test_deterministic_kernels_change_nothing_on_the_cpu():
    before = torch.are_deterministic_algorithms_enabled()
    assert use_deterministic_kernels(CPU) is False
    assert torch.are_deterministic_algorithms_enabled() == before
