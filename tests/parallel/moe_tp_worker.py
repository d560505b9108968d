"""Runs of the MoE tensor-parallel tests: the tiny GPT of the layout tests with MoE blocks.

Each case trains :data:`~tests.parallel.invariance_worker.STEPS` steps (no dropout,
so one process and tensor parallelism draw nothing differently) and reports the
per-step losses, the per-step training records (gradient norm, balance and z-loss,
tokens per expert) and the final weights as full numpy arrays by canonical name.
:func:`single` runs a case in this process (the plain trainer); :func:`rank_main`
runs a list of cases on a gloo group.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tests.parallel import invariance_worker as W

#: top-2 of 4 experts, a gated shared expert, the balance and z-losses on, no dropout
MOE = [
    "--model.hidden_dropout=0.0",
    "--model.attention_dropout=0.0",
    "--model.num_experts=4",
    "--model.moe_router_topk=2",
    "--model.moe_ffn_hidden_size=32",
    "--model.moe_shared_expert_intermediate_size=32",
    "--model.moe_shared_expert_gate=true",
    "--model.moe_aux_loss_coeff=0.01",
    "--model.moe_z_loss_coeff=0.001",
]
#: the record keys compared between layouts (besides the loss)
RECORD_KEYS = ("grad_norm", "load_balancing_loss", "z_loss")


def _records(run_dir: str) -> list[dict[str, float]]:
    """The training records of ``run_dir/metrics.jsonl``: the gradient norm and the MoE values."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [
        {
            k: v
            for k, v in row.items()
            if k in RECORD_KEYS or k.startswith(("tokens_per_expert/", "load_balancing_loss/"))
        }
        for row in rows
        if row.get("kind") == "train"
    ]


def _params(trainer: Any) -> dict[str, Any]:
    """The model's weights as full numpy arrays by canonical name (a collective under parallelism)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from epochal.model.init import canonical_name

    out = {}
    for key, value in sorted(trainer.app_state()["model"].state_dict().items()):
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[canonical_name(key)] = value.detach().cpu().numpy().copy()  # plain pickles
    if dist.is_initialized():  # pipeline stages hold different parts: the union
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, out)
        for part in parts:
            for key, value in part.items():
                out.setdefault(key, value)
    return out


def _summary(trainer: Any, result: Any, run_dir: str) -> dict[str, Any]:
    import torch.distributed as dist

    params = _params(trainer)
    if dist.is_initialized() and dist.get_rank() != 0:
        return {}
    return {"losses": result.losses, "records": _records(run_dir), "params": params}


def single(root: str, name: str, extra: list[str] = ()) -> dict[str, Any]:
    """One case with the single-process trainer in this process (one thread)."""
    from epochal.train.trainer import Trainer
    from tests.dist_utils import one_thread

    with one_thread():
        run_dir = os.path.join(root, name)
        tr = W._trainer(Trainer, "gpt", run_dir, os.path.join(root, "data"), [*MOE, *extra])
        return _summary(tr, tr.train(), run_dir)


def rank_main(
    rank: int, world_size: int, root: str, cases: list[tuple[str, list[str]]]
) -> dict[str, Any]:
    """Every case ``(name, overrides)`` on the gloo group in turn; rank 0's results by name."""
    import torch

    from epochal.parallel.config import ParallelConfig
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    torch.set_num_threads(1)
    info = init_distributed(ParallelConfig(backend="gloo"), "cpu")
    out = {}
    for name, extra in cases:
        run_dir = os.path.join(root, name)
        tr = W._trainer(
            ParallelTrainer,
            "gpt",
            run_dir,
            os.path.join(root, "data"),
            [*MOE, *extra],
            dist_info=info,
        )
        result = _summary(tr, tr.train(), run_dir)
        held = _experts_held(tr)
        if result:
            result["experts_held"] = held
        out[name] = result
    return out


def _experts_held(trainer: Any) -> list[int]:
    """The number of routed experts each MoE layer of this rank holds."""
    from epochal.model.layers.moe import MoEMLP

    return [
        len(m.experts)
        for part in trainer.engine.model_parts
        for m in part.modules()
        if isinstance(m, MoEMLP)
    ]
