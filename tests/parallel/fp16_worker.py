"""A rank of the fp16 layout tests: a few fp16 steps with an injected overflow, per layout.

Module-level so that spawned gloo ranks (tests/dist_utils.run_gloo) can import it.
"""

from __future__ import annotations

from typing import Any

KEYS = ("loss", "loss_scale", "skipped", "lr")


def config(run_dir: str, layout: list[str]) -> Any:
    from tests.train.test_fp16 import STEP, config

    return config(
        run_dir,
        STEP,
        "--training.train_step_kwargs={steps = [3]}",
        "--training.initial_loss_scale=65536",
        "--training.hysteresis=1",
        "--training.loss_scale_window=2",
        "--training.train_iters=6",
        "--model.num_layers=2",
        *layout,
    )


def data(cfg: Any, dp_rank: int = 0, dp_size: int = 1) -> Any:
    from epochal.train.inputs.loaders import make_loaders
    from tests.train.fp16_steps import IndexedCounting

    return make_loaders(
        cfg, IndexedCounting(1000, 8, 64), None, vocab_size=64, dp_rank=dp_rank, dp_size=dp_size
    )


def records(run_dir: str) -> list[list[float]]:
    from pathlib import Path

    from epochal.train.observe.metrics import read_metrics

    recs = read_metrics(Path(run_dir) / "metrics.jsonl")
    return [[r[k] for k in KEYS] for r in recs if r["kind"] == "train"]


def single(run_dir: str) -> list[list[float]]:
    """The single-process fp16 run's records."""
    from epochal.train.trainer import Trainer

    cfg = config(run_dir, [])
    Trainer(cfg, data=data(cfg), log=False).train()
    return records(run_dir)


def rank_main(rank: int, world_size: int, run_dir: str, layout: list[str]) -> Any:
    """One gloo rank of the fp16 run under ``layout``: rank 0 returns the records."""
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, layout)
    info = init_distributed(cfg.parallel, "cpu")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size)
    tr = ParallelTrainer(
        cfg, data=data(cfg, dims.coords(rank)["dp"], dims.dp), log=False, dist_info=info
    )
    tr.train()
    return records(run_dir) if rank == 0 else None
