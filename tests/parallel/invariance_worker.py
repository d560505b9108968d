"""Runs of the layout-invariance tests: several tiny trainings per process group, returned as digests.

A *case* is ``(name, model, overrides)``: ``model`` picks the model and its data
(``gpt``: the counting sequences with dropout; ``bert``: BioNeMo-style masked
sequences as Megatron's pairs (token types, the binary head) with dropout;
``t5``: Megatron's span corruption with dropout; ``esm``: ``epochal train``'s own
synthetic proteins), ``overrides`` the layout. Every
case trains :data:`STEPS` steps (20; 10 in the default test tier) of a global batch of 4 micro-batches of 2 samples
and reports its per-step losses, evaluation losses and logged values, and one
SHA-256 digest of the final model and optimizer state (full tensors, FQN-keyed,
so every layout is comparable). :func:`rank_main` runs a list of cases on one
gloo group (every rank returns the same dict); :func:`single` runs one case in
this process with the plain :class:`~epochal.train.trainer.Trainer`.

Every process computes with one thread: the kernels' results depend on the
thread count, which is part of the hardware, not of the layout.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from tests.tiny_gpt_args import TINY_GPT_ARGS

#: 20 steps in the slow tier (``EPOCHAL_SLOW_TESTS=1``), 10 in the default one: a step
#: whose bits differ shows in its own loss, so the default tier keeps its proof at half the time
STEPS = 20 if os.environ.get("EPOCHAL_SLOW_TESTS", "") not in ("", "0") else 10
BASE = [
    "--training.device=cpu",
    "--data.corpus=",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=8",
    f"--training.train_iters={STEPS}",
    f"--training.eval_interval={STEPS // 2}",
    "--training.eval_iters=1",
    "--optimizer.lr=0.005",
    "--optimizer.clip_grad=0.3",  # clipping active: the norm's bits reach the weights
    "--scheduler.lr_warmup_iters=2",
    "--checkpoint.save_interval=0",
    "--checkpoint.save_final=false",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]
DROPOUT = ["--model.hidden_dropout=0.1", "--model.attention_dropout=0.1"]
# 96 ids padded to 128, the padded ids outside the softmax (a model from a Hugging Face
# folder): every layout masks them the same way
GPT = [
    *TINY_GPT_ARGS,
    "--model.make_vocab_size_divisible_by=64",
    "--model.padded_vocab_in_softmax=false",
    *DROPOUT,
]
GPT_VOCAB = 96
#: every BERT / ESM-2 case (one reference serves data, tensor and context parallelism)
ENCODER_UNITS = ["--parallel.invariant_context_degree=4"]


def prepare(data_dir: str) -> None:
    """Write the T5 corpus into ``data_dir`` (once, before any rank reads it)."""
    from tests.parallel import t5_worker

    os.makedirs(data_dir, exist_ok=True)
    t5_worker.write_corpus(data_dir)


def _overrides(model: str, data_dir: str, extra: list[str]) -> tuple[Any, list[str]]:
    """(the worker module providing data, the full override list) of a model."""
    from tests.parallel import bert_worker, t5_worker

    if model == "gpt":
        return None, [*BASE, *GPT, *extra]
    if model == "t5":
        corpus = t5_worker.write_corpus(data_dir)  # written by prepare()
        return t5_worker, [
            *t5_worker.BASE,
            *corpus,
            *BASE,
            *DROPOUT,
            "--model.num_layers=1",
            *extra,
        ]
    # weight gradients in 2 x 4 sequence chunks: CP2 gives the bits of the other layouts
    shape = [*bert_worker.BASE, *BASE, "--model.num_layers=2", *ENCODER_UNITS]
    if model == "bert":  # Megatron's pairs: token types, the binary head, post-LN blocks
        return bert_worker, [*shape, *bert_worker.PAIRS, *DROPOUT, *extra]
    return bert_worker, [*shape, *bert_worker.esm(os.path.join(data_dir, "esm-cache")), *extra]


def _trainer(
    cls: type, model: str, run_dir: str, data_dir: str, extra: list[str], **kwargs: Any
) -> Any:
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.launch import rank0_first
    from epochal.train.config import build_config
    from epochal.train.inputs.loaders import build_data, make_loaders
    from tests.train.synthetic import CountingDataset

    worker, overrides = _overrides(model, data_dir, extra)
    cfg = build_config(preset="tiny", overrides=[f"--run_dir={run_dir}", *overrides])
    info = kwargs.get("dist_info")
    dims = ParallelDims.from_config(cfg.parallel, info.world_size if info else 1)
    dp_rank = dims.coords(info.rank)["dp"] if info else 0
    if model == "gpt":
        train = CountingDataset(10_000, 16, GPT_VOCAB)
        valid = CountingDataset(64, 16, GPT_VOCAB, offset=10**6)
        data = make_loaders(
            cfg, train, valid, vocab_size=GPT_VOCAB, dp_rank=dp_rank, dp_size=dims.dp
        )
    elif model == "t5":
        data = rank0_first(lambda: build_data(cfg, dp_rank=dp_rank, dp_size=dims.dp))
    else:
        data = rank0_first(lambda: worker.data(cfg, dp_rank, dims.dp))
    return cls(cfg, data=data, log=False, **kwargs)


def _digest(trainer: Any) -> str:
    """SHA-256 over the full model and optimizer tensors by FQN (a collective under parallelism)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from epochal.model.init import canonical_name

    state = trainer.app_state()
    items: dict[str, str] = {}
    for prefix, sd in (
        ("model", state["model"].state_dict()),
        ("optim", state["optimizer"].state_dict()),
    ):
        for key in sorted(sd):
            value = sd[key]
            if isinstance(value, DTensor):
                value = value.full_tensor()
            if isinstance(value, torch.Tensor):
                data = (
                    value.detach()
                    .cpu()
                    .reshape(-1)
                    .contiguous()
                    .view(torch.uint8)
                    .numpy()
                    .tobytes()
                )
                text = hashlib.sha256(data).hexdigest()
            else:
                text = repr(value)
            items[f"{prefix}.{canonical_name(key)}"] = text
    if dist.is_initialized():  # pipeline stages hold different parts: the union
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, items)
        for part in parts:
            for key, text in part.items():
                if items.setdefault(key, text) != text:
                    items[key] = "copies differ"
    return hashlib.sha256(repr(sorted(items.items())).encode()).hexdigest()


def _result(trainer: Any, result: Any) -> dict[str, Any]:
    return {
        "losses": result.losses,
        "eval": [loss for _, loss in trainer.eval_history],
        "logged": trainer.last_eval_logged,
        "digest": _digest(trainer),
    }


def single(root: str, name: str, model: str, extra: list[str] = ()) -> dict[str, Any]:
    """One case with the single-process :class:`~epochal.train.trainer.Trainer` (one thread).

    The run directory is ``root/name``; the data is in ``root/data`` (:func:`prepare`).
    """
    from epochal.train.trainer import Trainer
    from tests.dist_utils import one_thread

    with one_thread():
        run_dir = os.path.join(root, name)
        tr = _trainer(Trainer, model, run_dir, os.path.join(root, "data"), list(extra))
        return _result(tr, tr.train())


def single_rank(
    rank: int, world_size: int, root: str, name: str, model: str, extra: list[str]
) -> Any:
    """:func:`single` in a spawned process (a fresh CUDA context: cuBLAS reads its settings once)."""
    return single(root, name, model, extra)


def rank_main(
    rank: int,
    world_size: int,
    root: str,
    cases: list[tuple[str, str, list[str]]],
    device: str = "cpu",
) -> dict[str, Any]:
    """Every case ``(name, model, overrides)`` on the gloo group in turn; results by name.

    Run directories are ``root/name``; the data is in ``root/data`` (:func:`prepare`).
    ``device="cuda"``: the ranks share the GPU (gloo; the cases set ``training.device``).
    """
    import torch

    from epochal.parallel.config import ParallelConfig
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    torch.set_num_threads(1)
    info = init_distributed(ParallelConfig(backend="gloo"), device)
    out = {}
    for name, model, extra in cases:
        run_dir = os.path.join(root, name)
        tr = _trainer(
            ParallelTrainer, model, run_dir, os.path.join(root, "data"), list(extra), dist_info=info
        )
        out[name] = _result(tr, tr.train())
    return out
