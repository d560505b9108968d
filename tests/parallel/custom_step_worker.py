"""A rank of the custom-train-step layout tests: train Accelerate's custom-loss step a few steps.

Module-level so that spawned gloo ranks (tests/dist_utils.run_gloo) can import it.
"""

from __future__ import annotations

from typing import Any

STEPS = 3
KEYS = [3, 17, 40]
BASE = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--data.corpus=",
    "--data.mock=true",
    "--data.seq_length=16",
    "--model.hidden_size=32",
    "--model.num_layers=4",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=8",
    f"--training.train_iters={STEPS}",
    "--training.eval_interval=0",
    "--training.eval_iters=1",
    "--scheduler.lr_warmup_iters=0",
    "--checkpoint.save_interval=0",
    "--checkpoint.save_final=false",
    "--logging.progress=false",
    "--logging.tensorboard=false",
    "--training.train_step=tests.train.accelerate_custom_loss:GPTTrainStepWithCustomLoss",
    f"--training.train_step_kwargs={{keytoken_ids = {KEYS}, alpha = 0.25}}",
]


def config(run_dir: str, layout: list[str]) -> Any:
    from epochal.train.config import build_config

    return build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *BASE, *layout])


def data(cfg: Any, dp_rank: int = 0, dp_size: int = 1) -> Any:
    from epochal.train.inputs.loaders import make_loaders
    from tests.train.synthetic import CountingDataset

    return make_loaders(
        cfg,
        CountingDataset(10_000, 16, 96),
        CountingDataset(64, 16, 96, offset=10**6),
        vocab_size=96,
        dp_rank=dp_rank,
        dp_size=dp_size,
    )


def single(run_dir: str) -> dict[str, list[float]]:
    """The single-process Trainer's step losses, logged 'lm loss' and validation loss."""
    from epochal.train.trainer import Trainer

    cfg = config(run_dir, [])
    tr = Trainer(cfg, data=data(cfg), log=False)
    return _summary(tr, tr.train())


def rank_main(rank: int, world_size: int, run_dir: str, layout: list[str]) -> dict[str, Any]:
    """One gloo rank of a ParallelTrainer run under ``layout``."""
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, layout)
    info = init_distributed(cfg.parallel, "cpu")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size)
    tr = ParallelTrainer(
        cfg,
        data=data(cfg, dims.coords(rank)["dp"], dims.dp),
        log=False,
        dist_info=info,
    )
    return _summary(tr, tr.train())


def _summary(tr: Any, result: Any) -> dict[str, Any]:
    from epochal.train.observe.metrics import read_metrics

    out: dict[str, Any] = {"losses": result.losses, "eval": result.eval_loss}
    if tr.rank == 0:
        recs = read_metrics(tr.run_dir / "metrics.jsonl")
        out["lm"] = [r["lm loss"] for r in recs if r["kind"] == "train"]
    return out


EVAL_CALLBACK = "--training.eval_callback=tests.train.eval_metrics:token_accuracy"


def _eval_logits(tr: Any) -> dict[str, Any]:
    """Evaluation logits gathered over data-parallel ranks (None off the last stage), and metrics."""
    import torch

    from epochal.train import gather_across_data_parallel_groups

    logits = tr.evaluate_logits()
    whole = None
    if logits is not None:
        # numpy: tensors do not survive the trip through the spawn queue
        whole = torch.cat([gather_across_data_parallel_groups(x) for x in logits]).numpy()
    return {"logits": whole, "logged": dict(tr.last_eval_logged)}


def single_eval_logits(run_dir: str) -> dict[str, Any]:
    """Single process: evaluation logits, metrics, and a plain forward of the same batches."""
    import torch

    from epochal.train.trainer import Trainer

    cfg = config(run_dir, [EVAL_CALLBACK])
    tr = Trainer(cfg, data=data(cfg), log=False)
    out = _eval_logits(tr)
    model = tr.model_parts[0].eval()
    batches = [mb["tokens"] for mb, _ in zip(tr.data.valid_loader, range(len(out["logits"]) // 2))]
    with torch.no_grad():
        out["forward"] = torch.cat([model(tokens) for tokens in batches]).numpy()
    return out


def rank_eval_logits(rank: int, world_size: int, run_dir: str, layout: list[str]) -> dict[str, Any]:
    """One gloo rank: evaluation logits under ``layout``."""
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, [*layout, EVAL_CALLBACK])
    info = init_distributed(cfg.parallel, "cpu")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size)
    tr = ParallelTrainer(
        cfg, data=data(cfg, dims.coords(rank)["dp"], dims.dp), log=False, dist_info=info
    )
    return _eval_logits(tr)
