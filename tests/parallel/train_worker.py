"""torchrun entry point of the parallel trainer tests: train a tiny model on synthetic data.

Usage: python -m torch.distributed.run ... train_worker.py RUN_DIR TRAIN_ITERS [--pause-after N] [override ...]

With ``--pause-after N`` every rank writes its process id to ``RUN_DIR/paused_rank{r}``
after step N (after that step's evaluation/checkpoint) and then sleeps, so the test
can kill the job at a known point mid-run (torchrun starts each worker in a session
of its own, so killing torchrun's process group alone would leave them running).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from epochal._atomic import atomic_write
from epochal.parallel.dims import ParallelDims  # noqa: E402
from epochal.parallel.launch import init_distributed  # noqa: E402
from epochal.train.config import build_config  # noqa: E402
from epochal.train.inputs.loaders import make_loaders  # noqa: E402
from epochal.train.parallel_trainer import ParallelTrainer  # noqa: E402
from tests.tiny_gpt_args import TINY_GPT_ARGS  # noqa: E402
from tests.train.synthetic import CountingDataset  # noqa: E402

BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    *TINY_GPT_ARGS,
    "--model.hidden_dropout=0.1",
    "--model.attention_dropout=0.1",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=8",
    "--training.eval_interval=4",
    "--training.eval_iters=1",
    "--scheduler.lr_warmup_iters=2",
    "--scheduler.lr_decay_iters=12",
    "--checkpoint.save_interval=3",
    "--checkpoint.keep_last=10",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


def main(argv: list[str]) -> int:
    run_dir, iters, rest = argv[0], int(argv[1]), argv[2:]
    pause_after = None
    if rest[:1] == ["--pause-after"]:
        pause_after, rest = int(rest[1]), rest[2:]
    cfg = build_config(
        preset="tiny",
        overrides=[*BASE, f"--run_dir={run_dir}", f"--training.train_iters={iters}", *rest],
    )
    info = init_distributed(cfg.parallel, "cpu")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size)
    data = make_loaders(
        cfg,
        CountingDataset(100_000, 16, 96),
        CountingDataset(64, 16, 96, offset=10**6),
        vocab_size=96,
        dp_rank=dims.coords(info.rank)["dp"],
        dp_size=dims.dp,
    )
    trainer = ParallelTrainer(cfg, data=data, log=False, dist_info=info)
    if pause_after is not None:

        def pause(tr: ParallelTrainer, step: int, metrics: dict) -> None:
            if step == pause_after:
                atomic_write(Path(run_dir) / f"paused_rank{tr.rank}", str(os.getpid()))
                time.sleep(600)

        trainer.add_callback(pause)
    trainer.train()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
