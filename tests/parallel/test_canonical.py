"""Canonical reduction units: the group's tree equals one process's tree, bit for bit.

The collectives (:func:`tree_all_reduce`, :func:`tree_reduce_scatter`) are compared
with :func:`tree_sum` over all the chunks on one rank; the canonical model pieces
(linears, norms, embeddings, attention, loss) with the same model computed on one
rank, on two and four tensor-parallel ranks, with and without sequence parallelism,
and on two and four context-parallel ranks (the head exchange). The
training runs themselves are in :mod:`tests.parallel.test_layout_invariance`.
"""

from __future__ import annotations

import pytest
import torch

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.canonical import Reductions, folded_tree, token_chunk_sum, tree_sum
from epochal.parallel.canonical_plan import KeyedHeadAttention, canonical_refusal
from epochal.parallel.config import ParallelConfig
from tests.dist_utils import run_gloo

DEGREE = 8


def _chunks(seed: int) -> torch.Tensor:
    """``[DEGREE, 6, 10]`` partial results of widely different magnitudes (rounding matters)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(DEGREE, 6, 10, generator=g) * torch.logspace(-4, 4, DEGREE).view(-1, 1, 1)


def _collectives(rank: int, world_size: int) -> dict:
    """This rank's tree results, as lists (tensors do not travel back through the queue)."""
    import torch.distributed as dist

    from epochal.parallel.canonical import tree_all_reduce, tree_reduce_scatter

    red = Reductions(DEGREE, dist.group.WORLD)
    chunks = _chunks(0)
    mine = chunks[rank * red.local : (rank + 1) * red.local]
    local = tree_sum(mine)
    scatter = tree_reduce_scatter(local, 1, red) if 6 % world_size == 0 else None
    return {
        "all_reduce": tree_all_reduce(local, red).tolist(),
        "scatter": None if scatter is None else scatter.tolist(),
    }


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_the_groups_tree_is_one_processs_tree(world_size):
    whole = tree_sum(_chunks(0))
    results = run_gloo(_collectives, world_size)
    for rank, got in enumerate(results):
        assert got["all_reduce"] == whole.tolist()
        if got["scatter"] is not None:
            assert got["scatter"] == whole.chunk(world_size, 1)[rank].tolist()
    # the sequential sum (another order) is another number: the comparison can fail
    sequential = _chunks(0)[0]
    for part in _chunks(0)[1:]:
        sequential = sequential + part
    assert not torch.equal(sequential, whole)


def test_tree_sum_adds_adjacent_pairs_first():
    parts = _chunks(1)[:4]
    want = (parts[0] + parts[1]) + (parts[2] + parts[3])
    assert torch.equal(tree_sum(parts), want)
    with pytest.raises(ValueError, match="power-of-two"):
        tree_sum(parts[:3])


def test_token_chunk_sum_adds_the_folded_sequence_chunks():
    values = torch.randn(2, 32, 5) * torch.logspace(-3, 3, 32).view(1, -1, 1)
    red = Reductions(DEGREE)
    parts = [c.contiguous().sum((0, 1)) for c in values.chunk(2 * DEGREE, 1)]
    # leaf j: chunk j and its mirror 2D - 1 - j, the leaves added as the tree
    leaves = torch.stack([parts[j] + parts[2 * DEGREE - 1 - j] for j in range(DEGREE)])
    assert torch.equal(token_chunk_sum(values, red, sharded=False), tree_sum(leaves))
    assert not torch.equal(tree_sum(torch.stack(parts)), tree_sum(leaves))  # the order shows
    with pytest.raises(ValueError, match="invariant_degree=16"):
        token_chunk_sum(torch.randn(2, 12, 5), red, sharded=False)


def test_the_folded_tree_keeps_few_partials_and_is_the_tree():
    chunks = _chunks(2)
    calls = []

    def leaf(j, mirror):
        calls.append((j, mirror))
        return chunks[j] + chunks[mirror % DEGREE] * 3

    got = folded_tree(leaf, 2 * DEGREE)
    want = tree_sum(torch.stack([leaf(j, 2 * DEGREE - 1 - j) for j in range(DEGREE)]))
    assert torch.equal(got, want)
    assert calls[:2] == [(0, 15), (1, 14)]  # each leaf's two chunks, in the tree's order
    with pytest.raises(ValueError, match="folded tree"):
        folded_tree(leaf, 6)


def _context_token_sum(rank: int, world_size: int) -> list:
    import torch.distributed as dist

    from epochal.parallel.context_parallel import chunk_positions

    red = Reductions(DEGREE, None, dist.group.WORLD, context_degree=world_size)
    with pytest.raises(ValueError, match=f"invariant_degree=1 .*context_parallel={world_size}"):
        Reductions(1, None, dist.group.WORLD)
    g = torch.Generator().manual_seed(4)
    values = torch.randn(2, 32, 5, generator=g) * torch.logspace(-3, 3, 32).view(1, -1, 1)
    mine = values.index_select(1, chunk_positions(32, world_size, rank))
    return token_chunk_sum(mine, red, sharded=False).tolist()


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_a_context_parallel_token_sum_is_one_processs(world_size):
    g = torch.Generator().manual_seed(4)
    values = torch.randn(2, 32, 5, generator=g) * torch.logspace(-3, 3, 32).view(1, -1, 1)
    want = token_chunk_sum(values, Reductions(DEGREE), sharded=False).tolist()
    assert run_gloo(_context_token_sum, world_size) == [want] * world_size


def test_degree_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        Reductions(6)
    with pytest.raises(ConfigError, match="invariant_degree"):
        ParallelConfig(invariant_degree=12)


def _config(**kw) -> ModelConfig:
    base = dict(
        type="gpt",
        vocab_size=128,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        num_query_groups=4,
        ffn_hidden_size=64,
        max_position_embeddings=16,
    )
    return ModelConfig(**{**base, **kw})


def test_refusals_name_what_stops_the_units():
    assert canonical_refusal(_config(), DEGREE, tp=4, seq_length=16) is None
    assert "num_query_groups=2" in canonical_refusal(_config(num_query_groups=2), DEGREE, tp=4)
    assert "tensor_parallel=16" in canonical_refusal(_config(), DEGREE, tp=16)
    assert "data.seq_length" in canonical_refusal(_config(), DEGREE, seq_length=24)
    assert canonical_refusal(_config(), DEGREE, tp=2, cp=2, seq_length=32, context_degree=2) is None
    assert "invariant_context_degree=1" in canonical_refusal(_config(), DEGREE, cp=2)
    assert "context_parallel = 4" in canonical_refusal(
        _config(num_query_groups=2), DEGREE, tp=2, cp=2, context_degree=2
    )
    assert "context_parallel=16" in canonical_refusal(_config(), DEGREE, cp=16, context_degree=16)
    assert "32 sequence chunks" in canonical_refusal(
        _config(), DEGREE, seq_length=16, context_degree=16
    )
    assert "sequence chunks" in canonical_refusal(
        _config(num_attention_heads=16, num_query_groups=16, hidden_size=64),
        4,
        tp=4,
        cp=4,
        sequence_parallel=True,
        context_degree=4,
    )
    assert "hidden_size" in canonical_refusal(
        _config(hidden_size=36, num_attention_heads=4), DEGREE
    )
    assert canonical_refusal(_config(), 1) == "parallel.invariant_degree is 1"
    assert canonical_refusal(_config(), DEGREE, tp=2, packed=True) is None
    esm = _config(type="esm", token_dropout=True, mask_token_id=3)
    assert canonical_refusal(esm, DEGREE, cp=2, context_degree=2, packed=True) is None
    pairs = _config(type="bert", bert_binary_head=True, num_tokentypes=2)
    assert canonical_refusal(pairs, DEGREE, tp=2, cp=2, context_degree=2) is None
    moe = _config(num_experts=4, moe_ffn_hidden_size=32, add_bias_linear=False)
    assert canonical_refusal(moe, DEGREE, tp=2, sequence_parallel=True) is None
    assert canonical_refusal(moe, DEGREE, tp=2) is None
    assert canonical_refusal(moe, DEGREE, cp=2, context_degree=2) is None
    assert "add_bias_linear" in canonical_refusal(
        _config(num_experts=4, moe_ffn_hidden_size=32, add_bias_linear=True), DEGREE, tp=2
    )
    assert "moe_ffn_hidden_size" in canonical_refusal(
        _config(num_experts=4, moe_ffn_hidden_size=36, add_bias_linear=False), DEGREE
    )
    assert "head of a GPT model under context" in canonical_refusal(
        _config(head="pooled_classifier", num_labels=2), DEGREE, cp=2, context_degree=2
    )
    assert "binary head on packed rows" in canonical_refusal(
        pairs, DEGREE, cp=2, context_degree=2, packed=True
    )
    t5 = _config(type="t5", num_layers=2, decoder_num_layers=1)
    assert canonical_refusal(t5, DEGREE, tp=2, seq_length=32, decoder_seq_length=16) is None
    assert "data.seq_length_decoder (12)" in canonical_refusal(
        t5, DEGREE, tp=2, seq_length=32, decoder_seq_length=12
    )
    assert "sequence parallelism for T5" in canonical_refusal(
        t5, DEGREE, tp=2, sequence_parallel=True
    )
    assert "context parallelism for T5" in canonical_refusal(t5, DEGREE, cp=2, context_degree=2)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("kind", ["causal", "cross_biased"])
def test_a_heads_attention_does_not_depend_on_the_heads_in_the_call(dropout, kind):
    # queries/keys/values as the model makes them: views of [b, s, heads * hd]; a T5
    # cross-attention's keys are longer than its queries, and its self-attention adds the
    # relative bias of its heads
    b, heads, s, hd = 2, 4, 16, 8
    s_k = s if kind == "causal" else 24
    torch.manual_seed(0)
    base = [torch.randn(b, n, heads * hd) for n in (s, s_k, s_k)]
    bias = None if kind == "causal" else torch.randn(1, heads, s, s_k)
    grad = torch.randn(b, heads, s, hd)

    def run(xs, first, g, heads_bias):
        xs = [x.clone().requires_grad_() for x in xs]
        q, k, v = (x.view(b, x.shape[1], -1, hd).transpose(1, 2) for x in xs)
        torch.manual_seed(7)
        out = KeyedHeadAttention(first)(
            q, k, v, causal=kind == "causal", attention_mask=None, dropout_p=dropout,
            scale=None, position_bias=heads_bias,
        )  # fmt: skip
        return out, torch.autograd.grad(out, xs, g)

    out, grads = run(base, 0, grad, bias)
    for per in (1, 2):
        for r in range(heads // per):
            cols, heads_of = slice(r * per * hd, (r + 1) * per * hd), slice(r * per, (r + 1) * per)
            part, part_grads = run(
                [x[..., cols] for x in base],
                r * per,
                grad[:, heads_of],
                None if bias is None else bias[:, heads_of],
            )
            assert torch.equal(part, out[:, heads_of])
            for whole, piece in zip(grads, part_grads):
                assert torch.equal(whole[..., cols], piece)


def _model_grads(rank: int, world_size: int, llama: bool) -> list:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model.build import build_model
    from epochal.parallel.canonical_ops import canonical_cross_entropy
    from epochal.parallel.canonical_plan import install_canonical

    torch.set_num_threads(1)
    extra = (
        dict(
            normalization="RMSNorm",
            activation="swiglu",
            add_bias_linear=False,
            position_embedding_type="rope",
            num_query_groups=2 if world_size == 2 else 4,
            qk_layernorm=True,
        )
        if llama
        else {}
    )
    cfg = _config(hidden_dropout=0.1, attention_dropout=0.1, **extra)
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("tp",))
    out = []
    for tp_mesh, sp in ((None, False), (mesh["tp"], False), (mesh["tp"], True)):
        model = build_model(cfg, seed=1)
        model.init_weights(seed=1)
        red = install_canonical(
            model, DEGREE, tp_mesh, sequence_parallel=sp, context_degree=world_size
        )
        model.train()
        torch.manual_seed(3)
        tokens = torch.randint(0, 128, (2, 16))
        torch.manual_seed(5)
        loss = canonical_cross_entropy(model(tokens), tokens.roll(1, 1), red, 128).mean()
        loss.backward()
        grads = {
            n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
            for n, p in model.named_parameters()
        }
        out.append((loss.detach(), grads))
    blocking = {}
    for defer in (False, True):
        loss, grads, blocking[defer] = _context_parallel_grads(cfg, world_size, defer)
        out.append((loss, grads))
    dist.barrier()
    (one, one_grads), *layouts = out
    # compared here: tensors do not travel back through the result queue
    return [
        (
            torch.equal(loss, one),
            sorted(n for n, g in grads.items() if not torch.equal(g, one_grads[n])),
        )
        for loss, grads in layouts
    ] + [blocking]


def _context_parallel_grads(cfg: ModelConfig, world_size: int, defer: bool) -> tuple:
    """The loss, gradients and blocking all-reduces in the backward of the same step with every rank one context-parallel rank.

    ``defer``: the weight gradients completed after the backward
    (:mod:`epochal.parallel.canonical_deferred`), not in each op.
    """
    import torch.distributed as dist

    from epochal.model.build import build_model
    from epochal.parallel.canonical_ops import canonical_cross_entropy
    from epochal.parallel.canonical_plan import install_canonical
    from epochal.parallel.context_parallel import ContextParallel

    model = build_model(cfg, seed=1)
    model.init_weights(seed=1)
    cp = ContextParallel(dist.group.WORLD)
    red = install_canonical(
        model, DEGREE, cp_group=cp.group, context_degree=world_size, defer_completion=defer
    )
    model.train()
    torch.manual_seed(3)
    tokens = torch.randint(0, 128, (2, 16))
    torch.manual_seed(5)  # every rank draws the whole sequence's masks
    logits = cp.forward(model)(tokens)  # this rank's chunks
    local = canonical_cross_entropy(logits, cp.shard(tokens.roll(1, 1)), red, 128)
    loss = cp.gather(local).mean()  # every token's loss, global order
    calls, all_reduce = [], dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(kwargs.get("async_op", False))
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted
    try:
        loss.backward()
    finally:
        dist.all_reduce = all_reduce
    grads = {n: p.grad for n, p in model.named_parameters()}
    return loss.detach(), grads, calls.count(False)


@pytest.mark.distributed
@pytest.mark.parametrize(("world_size", "llama"), [(2, False), (4, True)])
def test_tensor_sequence_and_context_parallel_gradients_equal_one_process(world_size, llama):
    # learned positions at 2 ranks, RoPE with grouped keys/values at 4
    for *rank_result, blocking in run_gloo(_model_grads, world_size, llama):
        # TP, TP with SP, CP with each weight gradient completed in its op, and after the backward
        assert rank_result == [(True, []), (True, []), (True, []), (True, [])]
        if world_size == 2:  # a group of two completes them with all-reduces started together
            assert blocking[True] < blocking[False] // 4, blocking


def test_packed_rows_are_padded_to_the_same_multiple_on_every_layout():
    from epochal.parallel.config import ParallelConfig

    # the token sums' 2 * max(D, C) sequence chunks, whatever the layout
    layouts = [{}, {"tensor_parallel": 2}, {"tensor_parallel": 4, "sequence_parallel": True}]
    got = {ParallelConfig(**layout).packed_row_multiple(canonical=True) for layout in layouts}
    assert got == {2 * DEGREE}
    assert ParallelConfig(invariant_context_degree=16).packed_row_multiple(canonical=True) == 32
    # the plain rule: only what the layout cuts
    assert ParallelConfig(tensor_parallel=4, sequence_parallel=True).packed_row_multiple() == 4
