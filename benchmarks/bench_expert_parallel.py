"""Expert parallelism on CPU: tokens/s and peak memory per rank of ``moe-tiny``'s model at EP 1, 2 and 4.

The model of the ``moe-tiny`` preset (4 layers, 128 wide, 4 experts of width 192 in
every block, top-2, balance and z-losses on; vocabulary 4096) trains ``--steps`` steps
(forward, backward, clipping, AdamW) after one warm-up step through
:class:`epochal.parallel.engine.ParallelEngine`, on random tokens (the same global batch
for every layout: ``--global-batch`` sequences of ``--seq`` tokens, micro-batches of
``--micro-batch-size``). Each layout is one spawned gloo group, one thread per
process: EP ``N`` runs on ``N`` data-parallel processes, each holding ``4 / N`` experts
per block; ``--dp-baseline`` adds plain data parallelism on the same process counts
(every rank holds every expert), so the cost of the all-to-alls can be read off.
Every rank reports its peak resident memory (``VmHWM``), the resident memory before
the first step (model, optimizer, torch itself) and the parameters it holds; tokens/s
is the global batch's tokens over the mean step time. ``--plain`` turns
``training.layout_invariant`` off (the presets train with it on).

    python benchmarks/bench_expert_parallel.py                    # EP 1/2/4 and DP 2/4
    python benchmarks/bench_expert_parallel.py --ep 1,2 --steps 2 --no-dp-baseline
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.config import build_config, model_config_from_section
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.steps.gpt import GPTTrainStep
from process_memory import rss_mib

VOCAB = 4096  # moe-tiny's BPE vocabulary


def _model(seq: int) -> Any:
    cfg = build_config(preset="moe-tiny")
    return model_config_from_section(cfg.model, vocab_size=VOCAB, seq_length=seq)


def _rank(rank: int, world: int, ep: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pc = ParallelConfig(expert_parallel=ep)
        dims = ParallelDims.from_config(pc, world)
        mesh = dims.build_mesh("cpu") if world > 1 else None
        engine = ParallelEngine(
            pc,
            _model(args.seq),
            dims,
            mesh,
            device=torch.device("cpu"),
            seed=0,
            exact_sync=not args.plain,
        )
        opts = OptimizersContainer(
            engine.model_parts, lambda p: build_adamw([p], lr=1e-3, weight_decay=0.1)
        )
        held = sum(p.numel() for p in engine.parameters())
        per_rank = args.global_batch // world
        n_mb = per_rank // args.micro_batch_size
        g = torch.Generator().manual_seed(1000 + rank)
        data = torch.randint(0, VOCAB, (n_mb, args.micro_batch_size, args.seq + 1), generator=g)
        mbs = [
            {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(d.shape[0], args.seq)}
            for d in data
        ]
        base = rss_mib("VmRSS")
        times = []
        for i in range(args.steps + 1):
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
            opts.zero_grad(set_to_none=True)
            engine.forward_backward(mbs, step=GPTTrainStep())
            engine.clip_grad_norm(1.0)
            opts.step()
            if world > 1:
                dist.barrier()
            if i:  # the first step is warm-up
                times.append(time.perf_counter() - t0)
        out.put((rank, base, rss_mib("VmHWM"), sum(times) / len(times), held))
    except BaseException as exc:  # noqa: BLE001 - the parent must not wait for a dead rank
        out.put((rank, repr(exc), 0.0, 0.0, 0))
        raise
    finally:
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, ep: int, args: argparse.Namespace) -> list[tuple[Any, ...]]:
    """One layout's per-rank ``(rank, base MiB, peak MiB, seconds per step, parameters held)``."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, ep, port, args, out)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = sorted(out.get(timeout=1800) for _ in range(world))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failed = [r for r in results if isinstance(r[1], str)]
    if failed:
        raise RuntimeError(f"{world} processes, EP{ep}: rank {failed[0][0]} failed: {failed[0][1]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="1,2,4", help="expert-parallel sizes (= processes)")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up")
    parser.add_argument("--dp-baseline", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--plain", action="store_true", help="layout_invariant off")
    args = parser.parse_args()
    model = _model(args.seq)
    print(
        f"moe-tiny's model: {model.num_layers} layers x {model.hidden_size}, {model.num_experts} "
        f"experts of {model.moe_ffn_size} (top-{model.moe_router_topk}) per block, vocabulary "
        f"{VOCAB}; {args.global_batch} x {args.seq} tokens per step in micro-batches of "
        f"{args.micro_batch_size}; {args.steps} timed steps; 1 thread per process; "
        f"layout_invariant={not args.plain}"
    )
    print(
        "| processes | expert_parallel | experts per rank | parameters per rank "
        "| peak RSS per rank (MiB) | step memory per rank (MiB) | tokens/s |"
    )
    print("|---|---|---|---|---|---|---|")
    layouts = []
    for ep in (int(x) for x in args.ep.split(",")):
        if args.dp_baseline and ep > 1:
            layouts.append((ep, 1))
        layouts.append((ep, ep))
    for world, ep in layouts:
        res = run(world, ep, args)
        peak = max(r[2] for r in res)
        step = max(r[2] - r[1] for r in res)
        secs = max(r[3] for r in res)
        held = max(r[4] for r in res)
        tokens = args.global_batch * args.seq
        print(
            f"| {world} | {ep} | {model.num_experts // ep} | {held:,} | {peak:,.0f} | {step:,.0f} "
            f"| {tokens / secs:,.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
