"""Ranks of the expert-parallel tests: the trainer's cases (:mod:`tests.parallel.invariance_worker`)
and one step of a tiny MoE GPT under the communication ledger."""

from __future__ import annotations

from typing import Any

from epochal.model import ModelConfig
from tests.parallel import comm_worker as C
from tests.parallel import invariance_worker as W

#: the ledger's model: 2 MoE layers of 4 experts (top-2), 64 wide
SEQ, MBS = C.SEQ, C.MBS  # the ledger worker's micro-batches
HIDDEN, EXPERTS, TOPK, LAYERS, MICRO_BATCHES = 64, 4, 2, 2, 2


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
    ledger = C.one_step_ledger(
        world, {"expert_parallel": expert_parallel}, True, MICRO_BATCHES, cfg
    )
    return {key: [e.calls, e.bytes] for key, e in ledger.per_step().items()}


def rank_main(
    rank: int, world: int, root: str, cases: list[tuple[str, str, list[str]]]
) -> dict[str, Any]:
    """The trainer's ``cases`` (by name) and, under ``"ledger"``, one EP step's ledger."""
    out = W.rank_main(rank, world, root, cases)
    out["ledger"] = ledger_of_one_step(world, world)
    return out
