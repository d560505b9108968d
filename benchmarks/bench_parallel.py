"""Parallel layouts: training tokens/s of each layout against one process, same model and global batch.

Every layout trains the same GPT (same seed, same synthetic batches, AdamW,
gradient clipping) through :class:`epochal.parallel.engine.ParallelEngine` for
``--steps`` optimizer steps after ``--warmup`` steps; the reference is the same
engine in one process. All processes of a layout are spawned on this machine
(gloo on CPU, NCCL on CUDA) and the cores are split between them (a
2-process layout on 2 cores runs 1 thread per process; the single-process
reference is shown with all cores and with one).

On CPU the figures show the *overhead* of each layout (communication, DTensor
dispatch, pipeline bubbles): a CPU has no spare compute for model parallelism
to exploit. With CUDA the script uses every visible GPU, a GPT-2-small-sized
model (124M, seq 1024, bf16 autocast), and also reports model FLOPs utilization
and peak memory per GPU with and without the distributed optimizer and
activation recompute.

    python benchmarks/bench_parallel.py                 # CPU, 2 processes, about 2 minutes
    python benchmarks/bench_parallel.py --world 4       # 4-process layouts too
    python benchmarks/bench_parallel.py --layouts dp2,tp2_sp --steps 10
"""

from __future__ import annotations

import argparse
import os
import queue as queue_mod
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from epochal.model import ModelConfig
from epochal.model.flops import training_flops_per_token
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.steps.gpt import GPTTrainStep

PEAK_BF16_TFLOPS = {
    "H100": 989.0,
    "H200": 989.0,
    "H800": 989.0,
    "A100": 312.0,
    "L40": 181.0,
    "L4": 121.0,
}


@dataclass
class Layout:
    name: str
    world: int
    parallel: dict[str, Any] = field(default_factory=dict)


def cpu_layouts(world: int) -> list[Layout]:
    out = [
        Layout("1 process", 1),
        Layout("DP2 (replicated)", 2, {"dp_sharding": "none"}),
        Layout("DP2 distributed optimizer (ZeRO-2)", 2, {"dp_sharding": "optimizer"}),
        Layout("DP2 FSDP (ZeRO-3)", 2, {"dp_sharding": "full"}),
        Layout("TP2", 2, {"tensor_parallel": 2}),
        Layout("TP2 + SP", 2, {"tensor_parallel": 2, "sequence_parallel": True}),
        Layout("PP2 1F1B", 2, {"pipeline_parallel": 2, "pipeline_schedule": "1f1b"}),
        Layout("PP2 GPipe", 2, {"pipeline_parallel": 2, "pipeline_schedule": "gpipe"}),
        Layout(
            "PP2 interleaved (vpp 2)",
            2,
            {
                "pipeline_parallel": 2,
                "virtual_pipeline": 2,
                "pipeline_schedule": "interleaved_1f1b",
            },
        ),
        Layout(
            "TP2 + selective recompute",
            2,
            {"tensor_parallel": 2, "recompute_granularity": "selective"},
        ),
    ]
    if world >= 4:
        out += [
            Layout("TP2 x DP2", 4, {"tensor_parallel": 2}),
            Layout(
                "PP2 x TP2 (SP)",
                4,
                {"pipeline_parallel": 2, "tensor_parallel": 2, "sequence_parallel": True},
            ),
            Layout("PP2 x DP2 (ZeRO-2)", 4, {"pipeline_parallel": 2, "dp_sharding": "optimizer"}),
        ]
    return out


def gpu_layouts(world: int) -> list[Layout]:
    out = [
        Layout("1 GPU", 1),
        Layout("1 GPU, full recompute", 1, {"recompute_granularity": "full"}),
        Layout("1 GPU, selective recompute", 1, {"recompute_granularity": "selective"}),
    ]
    if world >= 2:
        n = world
        out += [
            Layout(f"DP{n} (replicated)", n, {"dp_sharding": "none"}),
            Layout(f"DP{n} distributed optimizer", n, {"dp_sharding": "optimizer"}),
            Layout(f"DP{n} FSDP", n, {"dp_sharding": "full"}),
            Layout(
                f"DP{n} FSDP + full recompute",
                n,
                {"dp_sharding": "full", "recompute_granularity": "full"},
            ),
            Layout(f"TP{n} + SP", n, {"tensor_parallel": n, "sequence_parallel": True}),
            Layout(f"PP{n} 1F1B", n, {"pipeline_parallel": n}),
        ]
    return out


def model_for(device: str) -> tuple[ModelConfig, int, int, int]:
    """(model, seq, micro-batch, global batch) of the benchmark on ``device``."""
    if device == "cuda":
        cfg = ModelConfig(
            vocab_size=50257,
            hidden_size=768,
            num_layers=12,
            num_attention_heads=12,
            max_position_embeddings=1024,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            activation="gelu_tanh",
        )
        return cfg, 1024, 4, 32
    cfg = ModelConfig(
        vocab_size=4000,
        hidden_size=256,
        num_layers=4,
        num_attention_heads=8,
        max_position_embeddings=128,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return cfg, 128, 4, 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int,
    world: int,
    port: int,
    layouts: list[Layout],
    args: argparse.Namespace,
    threads: int,
    q: Any,
) -> None:
    try:
        torch.set_num_threads(threads)
        cuda = args.device == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if world > 1:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        results = []
        for layout in layouts:
            try:
                results.append(_measure(layout, args, device, world))
            except Exception:  # noqa: BLE001 - one failing layout must not hide the others
                results.append({"error": traceback.format_exc()[-2000:]})
            if world > 1:
                dist.barrier()
            if cuda:
                torch.cuda.empty_cache()
        q.put((rank, True, results))
    except BaseException:  # noqa: BLE001 - report every failure to the parent
        q.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _measure(
    layout: Layout, args: argparse.Namespace, device: torch.device, world: int
) -> dict[str, float]:
    cfg, seq, mbs, gbs = model_for(device.type)
    pconf = ParallelConfig(**layout.parallel)
    dims = ParallelDims.from_config(pconf, world)
    dims.validate(cfg, micro_batch_size=mbs, global_batch_size=gbs, seq_length=seq, config=pconf)
    mesh = dims.build_mesh(device.type) if world > 1 else None
    engine = ParallelEngine(
        pconf, cfg, dims, mesh, device=device, seed=0, bf16=device.type == "cuda"
    )
    opts = OptimizersContainer(
        engine.model_parts, lambda p: build_adamw([p], lr=1e-4, weight_decay=0.1)
    )
    g = torch.Generator().manual_seed(0)
    n_mb = gbs // (mbs * dims.dp)
    data = torch.randint(0, cfg.vocab_size, (n_mb, mbs, seq + 1), generator=g).to(device)
    micro = [
        {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(mbs, seq, device=device)}
        for d in data
    ]
    feed = micro if engine.needs_batches() else []

    def step() -> None:
        opts.zero_grad()
        engine.forward_backward(feed, num_microbatches=n_mb, step=GPTTrainStep())
        engine.clip_grad_norm(1.0)
        opts.step()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    tokens = args.steps * gbs * seq
    out = {"tokens_per_s": tokens / dt}
    if device.type == "cuda":
        out["mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["tflops_per_gpu"] = training_flops_per_token(cfg, seq) * tokens / dt / world / 1e12
    return out


def run_group(
    layouts: list[Layout], world: int, args: argparse.Namespace, threads: int
) -> list[list[dict[str, Any]]]:
    """Run ``layouts`` (all of ``world`` processes) in ONE spawned group; per layout, the ranks' results."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, layouts, args, threads, q))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, ok, value = q.get(timeout=args.timeout)
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    except queue_mod.Empty:
        raise RuntimeError("timed out") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [[results[r][i] for r in range(world)] for i in range(len(layouts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--world",
        type=int,
        default=0,
        help="processes of the largest layouts (CPU default 2; CUDA: GPUs)",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--layouts", default="", help="comma-separated substrings of layout names to run"
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cores = os.cpu_count() or 1
    if args.device == "cuda":
        world = args.world or torch.cuda.device_count()
        layouts = gpu_layouts(world)
    else:
        world = args.world or 2
        layouts = cpu_layouts(world)
    if args.layouts:
        keys = [k.strip().lower() for k in args.layouts.split(",")]
        layouts = [
            lay
            for lay in layouts
            if lay.world == 1 or any(k in lay.name.lower().replace(" ", "_") for k in keys)
        ]
    cfg, seq, mbs, gbs = model_for(args.device)
    print(
        f"model: hidden {cfg.hidden_size}, {cfg.num_layers} layers, {cfg.num_attention_heads} heads, "
        f"vocab {cfg.padded_vocab_size}, seq {seq}; global batch {gbs} x {seq} tokens, micro-batch {mbs}; "
        f"{args.steps} timed steps after {args.warmup}; device {args.device}, {cores} CPU cores"
    )
    runs: list[tuple[str, Layout, int]] = []  # (row name, layout, threads)
    for layout in layouts:
        threads = max(1, cores // layout.world)
        if layout.world == 1 and args.device == "cpu" and threads > 1:
            runs.append((f"{layout.name}, {threads} threads", layout, threads))
            runs.append((f"{layout.name}, 1 thread", layout, 1))
        else:
            runs.append((layout.name, layout, threads))
    results: dict[str, list[dict[str, Any]]] = {}
    for world_size, threads in sorted({(lay.world, th) for _, lay, th in runs}):
        group = [(name, lay) for name, lay, th in runs if lay.world == world_size and th == threads]
        try:
            out = run_group([lay for _, lay in group], world_size, args, threads)
        except RuntimeError as exc:
            print(f"{world_size}-process group failed:\n{exc}")
            continue
        for (name, _), res in zip(group, out):
            results[name] = res
            if "error" in res[0]:
                print(f"  {name}: FAILED\n{res[0]['error']}")
            else:
                print(f"  {name}: {res[0]['tokens_per_s']:,.0f} tokens/s", flush=True)
    rows = []
    base = None
    for name, layout, th in runs:
        res = results.get(name)
        if res is None or "error" in res[0]:
            continue
        tps = res[0]["tokens_per_s"]
        if base is None:
            base = tps
        row = {
            "layout": name,
            "procs": layout.world,
            "threads": th,
            "tokens/s": tps,
            "vs 1 process": tps / base,
        }
        if args.device == "cuda":
            row["mem/GPU GiB"] = max(r["mem_gib"] for r in res)
            tf = res[0]["tflops_per_gpu"]
            peak = args.peak_tflops or next(
                (v for k, v in PEAK_BF16_TFLOPS.items() if k in torch.cuda.get_device_name()), 0.0
            )
            row["MFU"] = tf / peak if peak else float("nan")
        rows.append(row)
    cols = list(rows[0]) if rows else []
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for row in rows:
        cells = []
        for c in cols:
            v = row[c]
            if c == "tokens/s":
                cells.append(f"{v:,.0f}")
            elif c in ("vs 1 process", "MFU"):
                cells.append(f"{v:.2f}x" if c != "MFU" else f"{100 * v:.1f}%")
            elif isinstance(v, float):
                cells.append(f"{v:,.1f}")
            else:
                cells.append(str(v))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
