"""The projection of context parallelism's measured traffic onto another model: bytes from its shapes."""

from __future__ import annotations

import math

import torch

from epochal.model import ModelConfig, build_model
from epochal.parallel.comm_projection import Cluster, Run, project, ring_overlap


def _gqa_model() -> ModelConfig:
    return ModelConfig(
        vocab_size=1024,
        hidden_size=256,
        num_layers=4,
        num_attention_heads=8,
        num_query_groups=4,
        max_position_embeddings=4096,
        position_embedding_type="rope",
    )


def test_cp_projection_sends_the_keys_and_values_of_the_target_model():
    model = _gqa_model()
    run = Run(model=model, seq_length=4096, micro_batch_size=1, global_batch_size=8,
              tp=2, cp=4, dp=2, grad_bytes=4, act_bytes=2)  # fmt: skip
    rows, _ = project(run, Cluster(), "dp2_cp2")
    m = run.micro_batches
    assert m == 4
    # from the model's shapes: K and V, [b, S, query groups / tp, head size] each, bf16,
    # every layer and micro-batch; the whole sequence (the all-gather's output)
    head = model.hidden_size // model.num_attention_heads
    kv = 2 * run.micro_batch_size * run.seq_length * (model.num_query_groups // run.tp) * head * 2
    expected = kv * model.num_layers * m
    by_kind = {(r.kind, r.group): r for r in rows if r.bytes > 1e6}
    assert math.isclose(by_kind["all_gather", "cp"].bytes, expected, rel_tol=1e-9)
    assert math.isclose(by_kind["reduce_scatter", "cp"].bytes, expected, rel_tol=1e-9)
    assert by_kind["all_gather", "cp"].calls == by_kind["reduce_scatter", "cp"].calls
    assert by_kind["all_gather", "cp"].calls == 2 * model.num_layers * m
    # once per step, the weight gradients summed over the group (fp32, this TP rank's shard)
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(model).parameters())
    assert math.isclose(by_kind["all_reduce", "cp"].bytes, params / run.tp * 4, rel_tol=1e-9)
    assert by_kind["all_reduce", "cp"].calls == 1
    # nothing of context parallelism overlaps with compute in epochal's all-gather design
    assert all(r.hidden == 0 for r in rows if r.group == "cp")


def test_ring_overlap_compares_the_exchange_with_the_attention_it_could_hide_behind():
    run = Run(model=_gqa_model(), seq_length=4096, micro_batch_size=1, global_batch_size=8, cp=4)
    exchange, compute = ring_overlap(run, Cluster())
    longer = Run(model=_gqa_model(), seq_length=8192, micro_batch_size=1, global_batch_size=8, cp=4)
    exchange2, compute2 = ring_overlap(longer, Cluster())
    assert exchange2 < 2.01 * exchange  # the exchange grows with the sequence
    assert math.isclose(compute2, 4 * compute)  # the attention with its square
