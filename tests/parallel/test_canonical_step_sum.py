"""Weight gradients whose sequence chunks are summed once per step: one process's bits on CP ranks.

One process holding every chunk of each weight gradient (a sink per weight) and two or
four context-parallel ranks holding one chunk each (the parameter's own gradient,
completed once at the end) accumulate two micro-batches and must agree bit for bit;
the completions per step are counted (one all-reduce per weight, not one per weight
and micro-batch). The training runs are in :mod:`tests.parallel.test_layout_invariance`.
"""

from __future__ import annotations

import pytest
import torch

from epochal.parallel.canonical_step_sum import LeafSink, StepSums, step_sums_order
from epochal.parallel.config import ParallelConfig
from tests.dist_utils import run_gloo

DEGREE = 8


def _grads(cfg, cp_group, context_degree: int, step_sums: bool, counted: list) -> tuple:
    """Loss sum and gradients of two accumulated micro-batches, computed in canonical units."""
    import torch.distributed as dist

    from epochal.model.build import build_model
    from epochal.parallel.canonical_ops import canonical_cross_entropy
    from epochal.parallel.canonical_plan import install_canonical
    from epochal.parallel.canonical_step_sum import begin_step_sums, finish_step_sums
    from epochal.parallel.context_parallel import ContextParallel

    model = build_model(cfg, seed=1)
    model.init_weights(seed=1)
    cp = ContextParallel(cp_group) if cp_group is not None else None
    red = install_canonical(
        model,
        DEGREE,
        cp_group=cp_group,
        context_degree=context_degree,
        defer_completion=cp is not None,
        step_sums=step_sums,
    )
    model.train()
    begin_step_sums([model])
    losses = []
    all_reduce = dist.all_reduce if dist.is_initialized() else None

    def counting(*args, **kwargs):
        counted.append(args[0].numel())
        return all_reduce(*args, **kwargs)

    for k in range(2):
        torch.manual_seed(3 + k)
        tokens = torch.randint(0, 128, (2, 16))
        torch.manual_seed(5 + k)
        if cp is None:
            loss = canonical_cross_entropy(model(tokens), tokens.roll(1, 1), red, 128).mean()
        else:
            logits = cp.forward(model)(tokens)
            local = canonical_cross_entropy(logits, cp.shard(tokens.roll(1, 1)), red, 128)
            loss = cp.gather(local).mean()
        if all_reduce is not None:
            dist.all_reduce = counting
        try:
            loss.backward()
            if k == 1:
                finish_step_sums([model])
        finally:
            if all_reduce is not None:
                dist.all_reduce = all_reduce
        losses.append(loss.detach())
    summed = model.__dict__.get("canonical_step_sums")
    counted.append(-len(summed.modules) if summed is not None else 0)  # the weights summed so
    return torch.stack(losses), {n: p.grad for n, p in model.named_parameters()}


def _step_sums_grads(rank: int, world_size: int) -> list:
    import torch.distributed as dist

    from epochal.model.config import ModelConfig

    torch.set_num_threads(1)
    cfg = ModelConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_hidden_size=128,
        max_position_embeddings=16,
        vocab_size=128,
        normalization="RMSNorm",
        activation="swiglu",
        add_bias_linear=False,
        position_embedding_type="rope",
        num_query_groups=world_size,
        untie_embeddings_and_output_weights=True,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )
    out, counts = [], []
    for group, step in (
        (None, True),
        (dist.group.WORLD, True),
        (None, False),
        (dist.group.WORLD, False),
    ):
        counted: list[int] = []
        out.append(_grads(cfg, group, world_size, step, counted))
        # matrix-sized all-reduces (not the norms'), and the weights summed once per step
        counts.append((sum(n > 64 for n in counted[:-1]), -counted[-1]))
    (one_loss, one), (cp_loss, cp), (_, per_micro_batch), _ = out
    return [
        torch.equal(one_loss, cp_loss),
        sorted(n for n, g in cp.items() if not torch.equal(g, one[n])),
        # the other order is another sum: the comparison can fail
        sorted(n for n, g in per_micro_batch.items() if not torch.equal(g, one[n])) != [],
        (counts[1][0], counts[3][0], counts[1][1]),
    ]


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_context_parallel_ranks_sum_each_weights_chunks_once_per_step(world_size):
    for same_loss, differing, orders_differ, (step, per_micro_batch, weights) in run_gloo(
        _step_sums_grads, world_size
    ):
        assert same_loss
        assert differing == []
        assert orders_differ
        if world_size == 2:  # larger groups complete by halving (point-to-point)
            # every linear's weight and the untied head once per step instead of once
            # per micro-batch; the embedding table still per micro-batch (2 x 1)
            assert weights == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer
            assert (step, per_micro_batch) == (weights + 2, 2 * weights + 2)


def test_a_sink_accumulates_each_leaf_then_adds_the_tree():
    param = torch.nn.Parameter(torch.zeros(3))
    sink = LeafSink(param, 2)
    leaves = {(k, j): torch.randn(3) * 10.0 ** (k - j) for k in range(3) for j in range(2)}
    for k in range(3):
        sink.take_leaves(lambda j, m, k=k: leaves[(k, j)].clone(), 4, lambda t: t)
    a0 = (leaves[(0, 0)] + leaves[(1, 0)]) + leaves[(2, 0)]
    a1 = (leaves[(0, 1)] + leaves[(1, 1)]) + leaves[(2, 1)]
    assert torch.equal(sink.subtree(), a0 + a1)
    assert sink.subtree() is None  # consumed
    with pytest.raises(ValueError, match="do not hold 2 leaves"):
        sink.take_leaves(lambda j, m: torch.zeros(3), 2, lambda t: t)


def test_step_order_is_refused_where_a_rank_holds_several_chunks_under_compile():
    pc = ParallelConfig(invariant_context_degree=2)
    assert pc.invariant_context_accumulation == "step"  # the default
    assert step_sums_order(pc, cp=2, compile=True)  # one chunk per rank: any layout
    assert step_sums_order(pc, cp=1, compile=False)  # one process: a sink per weight
    with pytest.raises(ValueError, match="training.compile.*accumulation=micro_batch"):
        step_sums_order(pc, cp=1, compile=True)
    micro = ParallelConfig(invariant_context_degree=2, invariant_context_accumulation="micro_batch")
    assert not step_sums_order(micro, cp=1, compile=True)
    linear = torch.nn.Linear(1, 1)
    assert StepSums(None, 1).take(linear, linear.weight)[1] is False
