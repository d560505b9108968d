"""Fine-tuning (``[sft]``) runs for the SFT tests: a tiny GPT on the package's example chat rows.

Module-level so that spawned gloo ranks (tests/dist_utils.run_gloo) can import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR

#: a 2-layer, 64-wide Llama-style GPT, 80 tokens (every example row fits)
TINY = [
    "--model.hidden_size=64",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=2",
    "--model.ffn_hidden_size=128",
    "--data.seq_length=80",
    "--training.device=cpu",
    "--training.eval_iters=1",
    "--checkpoint.save_interval=0",
    "--logging.log_interval=1",
    "--scheduler.lr_warmup_fraction=0",
    "--scheduler.lr_warmup_iters=0",
    "--optimizer.lr=3e-3",
]


def write_rows(root: Path, first: int, count: int, name: str) -> Path:
    """Rows ``[first, first + count)`` of the example chat file as ``root/name``."""
    lines = CHAT_FILE.read_text().splitlines()[first : first + count]
    path = root / name
    path.write_text("\n".join(lines) + "\n")
    return path


def config(run_dir: str, extra: list[str]) -> Any:
    """The ``sft-tiny`` preset shrunk to :data:`TINY`, with the overrides ``extra``."""
    from epochal.train.config import build_config

    overrides = [f"--run_dir={run_dir}", f"--sft.tokenizer={TOKENIZER_DIR}", *TINY, *extra]
    return build_config(preset="sft-tiny", overrides=overrides)


def _result(tr: Any, result: Any) -> dict[str, Any]:
    return {"losses": result.losses, "eval": result.eval_loss}


def single(run_dir: str, extra: list[str]) -> dict[str, Any]:
    """One process's step losses and last validation loss."""
    from epochal.train.trainer import Trainer

    tr = Trainer(config(run_dir, extra), log=False)
    return _result(tr, tr.train())


def rank_main(rank: int, world_size: int, run_dir: str, extra: list[str]) -> dict[str, Any]:
    """One gloo rank of a ParallelTrainer run with the overrides ``extra`` (the layout)."""
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, extra)
    info = init_distributed(cfg.parallel, "cpu")
    tr = ParallelTrainer(cfg, log=False, dist_info=info)
    return _result(tr, tr.train())
