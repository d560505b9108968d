"""Ranks of the expert-parallel tests: the trainer's cases (:mod:`tests.parallel.invariance_worker`)
and one step of a tiny MoE GPT under the communication ledger."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from epochal.model import ModelConfig
from epochal.parallel.comm_ledger import CommLedger
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from tests.parallel import invariance_worker as W

#: the ledger's model: 2 MoE layers of 4 experts (top-2), 64 wide; micro-batches of 2 x 32 tokens
SEQ, MBS, HIDDEN, EXPERTS, TOPK, LAYERS, MICRO_BATCHES = 32, 2, 64, 4, 2, 2, 2


def ledger_of_one_step(world: int, expert_parallel: int) -> dict[tuple[str, str], list[int]]:
    """``{(kind, group): [calls, bytes]}`` of one layout-invariant step after a warm-up step."""
    cfg = ModelConfig(
        vocab_size=256,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        num_attention_heads=4,
        max_position_embeddings=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        num_experts=EXPERTS,
        moe_router_topk=TOPK,
        moe_ffn_hidden_size=32,
    )
    pconf = ParallelConfig(expert_parallel=expert_parallel)
    dims = ParallelDims.from_config(pconf, world)
    mesh = dims.build_mesh("cpu")
    engine = ParallelEngine(
        pconf, cfg, dims, mesh, device=torch.device("cpu"), seed=0, layout_invariant=True
    )
    opts = OptimizersContainer(
        engine.model_parts, lambda p: build_adamw([p], lr=1e-3, weight_decay=0.0)
    )
    g = torch.Generator().manual_seed(dist.get_rank())
    data = torch.randint(0, cfg.vocab_size, (MICRO_BATCHES, MBS, SEQ + 1), generator=g)
    micro = [
        {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(MBS, SEQ)} for d in data
    ]

    def step() -> None:
        opts.zero_grad()
        engine.forward_backward(micro)
        engine.clip_grad_norm(1.0)
        opts.step()

    step()
    groups = {"dp": mesh.get_group("dp"), "ep": engine.ep.group if engine.ep else None}
    with CommLedger(groups=groups) as ledger:
        step()
        ledger.end_step()
    return {key: [e.calls, e.bytes] for key, e in ledger.per_step().items()}


def rank_main(
    rank: int, world: int, root: str, cases: list[tuple[str, str, list[str]]]
) -> dict[str, Any]:
    """The trainer's ``cases`` (by name) and, under ``"ledger"``, one EP step's ledger."""
    out = W.rank_main(rank, world, root, cases)
    out["ledger"] = ledger_of_one_step(world, world)
    return out
