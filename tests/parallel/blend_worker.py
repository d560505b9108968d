"""torchrun entry point of the blend-schedule kill test: ``epochal train``'s parallel trainer on a config.

Usage: python -m torch.distributed.run ... blend_worker.py RUN_DIR [--pause-after N] [override ...]

The data comes from the overrides (a scheduled blend of indexed files). With
``--pause-after N`` every rank writes its process id to ``RUN_DIR/paused_rank{r}``
after step N (after that step's checkpoint) and then sleeps, so the test can kill the
job with SIGKILL at a known point.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from epochal._atomic import atomic_write  # noqa: E402
from epochal.parallel.launch import init_distributed  # noqa: E402
from epochal.train.config import build_config  # noqa: E402
from epochal.train.parallel_trainer import ParallelTrainer  # noqa: E402


def main(argv: list[str]) -> int:
    run_dir, rest = argv[0], argv[1:]
    pause_after = None
    if rest[:1] == ["--pause-after"]:
        pause_after, rest = int(rest[1]), rest[2:]
    cfg = build_config(preset="tiny", overrides=[*rest, f"--run_dir={run_dir}"])
    info = init_distributed(cfg.parallel, "cpu")
    trainer = ParallelTrainer(cfg, log=False, dist_info=info)
    if pause_after is not None:

        def pause(tr: ParallelTrainer, step: int, metrics: dict) -> None:
            if step == pause_after:
                atomic_write(Path(run_dir) / f"paused_rank{tr.rank}", str(os.getpid()))
                time.sleep(600)

        trainer.add_callback(pause)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
