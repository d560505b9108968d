"""Ranks of the communication-ledger test: tiny GPT steps under the ledger (DP2 plain, DP2
layout-invariant, TP2 with sequence parallelism, CP2)."""

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
from epochal.train.steps.gpt import GPTTrainStep

#: plain context parallelism gathering keys and values (the default, auto, exchanges heads)
ALLGATHER = {"context_parallel_exchange": "allgather"}

SEQ, MBS = 32, 2


def model_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=256,
        hidden_size=64,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=SEQ,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def one_step_ledger(
    world: int,
    fields: dict[str, Any],
    invariant: bool,
    micro_batches: int,
    cfg: ModelConfig | None = None,
) -> CommLedger:
    """The ledger of one counted step of ``cfg`` (default: :func:`model_config`) after a warm-up
    step, with the layout's groups named (mesh dimensions of size > 1, and ``ep``)."""
    cfg = cfg or model_config()
    pconf = ParallelConfig(**fields)
    dims = ParallelDims.from_config(pconf, world)
    mesh = dims.build_mesh("cpu")
    engine = ParallelEngine(
        pconf, cfg, dims, mesh, device=torch.device("cpu"), seed=0, exact_sync=invariant
    )
    opts = OptimizersContainer(
        engine.model_parts, lambda p: build_adamw([p], lr=1e-3, weight_decay=0.0)
    )
    g = torch.Generator().manual_seed(dist.get_rank())
    data = torch.randint(0, cfg.vocab_size, (micro_batches, MBS, SEQ + 1), generator=g)
    micro = [
        {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(MBS, SEQ)} for d in data
    ]

    def step() -> None:
        opts.zero_grad()
        engine.forward_backward(micro, step=GPTTrainStep())
        engine.clip_grad_norm(1.0)
        opts.step()

    step()
    names = [n for n in mesh.mesh_dim_names if mesh[n].size() > 1]
    groups = {n: mesh.get_group(n) for n in names}
    if engine.ep is not None:
        groups["ep"] = engine.ep.group
    with CommLedger(groups=groups) as ledger:
        step()
        ledger.end_step()
    return ledger


def _ledger_of(
    world: int, fields: dict[str, Any], invariant: bool, micro_batches: int
) -> list[list[tuple[str, str, int]]]:
    """Every call of one counted step (after a warm-up step), in issue order."""
    ledger = one_step_ledger(world, fields, invariant, micro_batches)
    assert len(ledger.steps) == 1
    for (kind, group), entry in ledger.per_step().items():  # the totals agree with the calls
        sizes = [b for k, g, b in ledger.calls[0] if (k, g) == (kind, group)]
        assert (entry.calls, entry.bytes) == (len(sizes), sum(sizes)), (kind, group)
    return ledger.calls


def rank_main(rank: int, world: int, micro_batches: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    return {
        "dp": _ledger_of(world, {}, False, micro_batches),
        "dp_invariant": _ledger_of(world, {}, True, micro_batches),
        "tp_sp": _ledger_of(
            world, {"tensor_parallel": 2, "sequence_parallel": True}, False, micro_batches
        ),
        "cp": _ledger_of(world, {"context_parallel": 2, **ALLGATHER}, False, micro_batches),
    }
