"""Layout invariance: step time and peak memory of the invariant gradient reduction against the plain one.

The same model, global batch and micro-batch size train through
:class:`epochal.parallel.engine.ParallelEngine` on ``DP`` data-parallel gloo
processes of this machine, with ``layout_invariant=False`` (FSDP2's reduction:
gradients accumulated locally, one all-reduce / reduce-scatter per step,
averaged over ranks) and ``layout_invariant=True`` (one all-to-all per
micro-batch and the gradients added in the global micro-batch order, exact
gradient norm; :mod:`epochal.parallel.ordered_reduce`). Both engines live in
the same processes and their steps alternate (plain, invariant, plain, ...), so
a busy machine slows both alike; the table gives the median step time of each
and their ratio. Peak memory is each mode's peak resident set (CPU; the
maximum over ranks) measured in processes of its own, or the peak CUDA
allocation.

Shapes: ``tiny`` is the ``tiny`` preset's GPT (4 layers, 128 wide, vocabulary
4096), ``esm2-8m`` the ESM-2 8M shape (6 layers, 320 wide, 20 heads); the
sequence length and micro-batch size are options (the presets' 1024-token
ESM micro-batches take minutes per step on a CPU). The global batch is
``--micro-batches`` micro-batches, so DP2 accumulates twice as many per rank as DP4.

    python benchmarks/bench_layout_invariance.py                      # both shapes, DP2 and DP4
    python benchmarks/bench_layout_invariance.py --shapes tiny --dp 2 --steps 10
    python benchmarks/bench_layout_invariance.py --drift-steps 100 --seq 64   # TP2 against 1
    python benchmarks/bench_layout_invariance.py --shapes wide --dp 1 --tp 2 --seq 512 --micro-batch-size 1 --micro-batches 2
    python benchmarks/bench_layout_invariance.py --shapes wide --dp 1 --cp 2 --seq 512 --micro-batch-size 1 --micro-batches 2

``--tp`` runs every row under tensor parallelism (``--sp``: with sequence
parallelism), ``--cp`` under context parallelism (the plain mode all-gathers keys
and values, the invariant one exchanges heads); the invariant mode then computes in canonical units
(``--degree``, :mod:`epochal.parallel.canonical`), the plain mode with
DTensor's tensor parallelism. ``wide`` is the ``tiny`` preset's architecture at
hidden 512, 4 layers, MLP 1408.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.dist_utils import run_gloo  # spawned gloo ranks, killed on any failure

from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.config import build_config, model_config_from_section
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.steps.gpt import GPTTrainStep

MODES = {"plain": False, "invariant": True}


#: shapes that are a preset's architecture at another size
WIDE = {
    "wide": (
        "tiny",
        [
            "--model.hidden_size=512",
            "--model.num_layers=4",
            "--model.num_attention_heads=8",
            "--model.num_query_groups=8",
            "--model.ffn_hidden_size=1408",
        ],
    )
}


def model_for(shape: str, seq: int) -> Any:
    """The model of a shape (the preset's architecture) for sequences of ``seq`` tokens."""
    preset, extra = WIDE.get(shape, (shape, []))
    cfg = build_config(
        preset=preset, overrides=[f"--data.seq_length={seq}", *extra], require_data=False
    )
    shape = preset
    vocab = 4096 if shape == "tiny" else 33
    return model_config_from_section(cfg.model, vocab_size=vocab, seq_length=seq)


def _engine(
    args: argparse.Namespace, shape: str, dp: int, sharding: str, invariant: bool
) -> tuple[Any, Any, Any]:
    """(step function, engine, optimizers) of one mode on this rank."""
    cuda = args.device == "cuda"
    device = torch.device("cuda", dist.get_rank()) if cuda else torch.device("cpu")
    cfg = model_for(shape, args.seq)
    tp = args.tp
    pconf = ParallelConfig(
        dp_sharding=sharding,
        tensor_parallel=tp,
        sequence_parallel=args.sp and tp > 1,
        context_parallel=args.cp,
        invariant_context_accumulation=args.accumulation,
    )
    dims = ParallelDims.from_config(pconf, dp * tp * args.cp)
    mesh = dims.build_mesh(device.type)
    engine = ParallelEngine(
        pconf,
        cfg,
        dims,
        mesh,
        device=device,
        seed=0,
        exact_sync=invariant,
        canonical_degree=args.degree if invariant else 0,
    )
    opts = OptimizersContainer(
        engine.model_parts, lambda p: build_adamw([p], lr=1e-4, weight_decay=0.1)
    )
    n_mb = args.micro_batches // dp
    # a model replica's ranks (tensor- and context-parallel) agree
    g = torch.Generator().manual_seed(dist.get_rank() // (tp * args.cp))
    data = torch.randint(
        4, cfg.vocab_size, (n_mb, args.micro_batch_size, args.seq + 1), generator=g
    )
    micro = [
        {
            "tokens": d[:, :-1].to(device),
            "labels": d[:, 1:].to(device),
            "loss_mask": torch.ones(args.micro_batch_size, args.seq, device=device),
        }
        for d in data
    ]

    def step() -> None:
        opts.zero_grad()
        engine.forward_backward(micro, step=GPTTrainStep())
        engine.clip_grad_norm(1.0)
        opts.step()

    return step, engine, opts


def _timed(step: Any, cuda: bool) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # a step lasts until its slowest rank is done
    return float(dt.item())


def _time_both(
    rank: int, world: int, args: argparse.Namespace, shape: str, sharding: str
) -> dict[str, Any]:
    """Both modes in this group, steps alternating: each mode's step times."""
    _setup(args, world)
    dp = world // (args.tp * args.cp)
    steps = {name: _engine(args, shape, dp, sharding, inv)[0] for name, inv in MODES.items()}
    times: dict[str, list[float]] = {name: [] for name in MODES}
    for i in range(args.warmup + args.steps):
        for name, step in steps.items():
            dt = _timed(step, args.device == "cuda")
            if i >= args.warmup:
                times[name].append(dt)
    return times


def _peak_memory(
    rank: int, world: int, args: argparse.Namespace, shape: str, sharding: str, mode: str
) -> float:
    """One mode alone: its peak memory in MiB (max over ranks)."""
    _setup(args, world)
    dp = world // (args.tp * args.cp)
    cuda = args.device == "cuda"
    step = _engine(args, shape, dp, sharding, MODES[mode])[0]
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        step()
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    t = torch.tensor([peak], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _tp_drift(rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    """The tiny GPT (no dropout) for ``args.drift_steps`` steps in one process and under TP2."""
    _setup(args, world)
    from torch.distributed.tensor import DTensor

    cfg = model_for("tiny", args.seq)
    g = torch.Generator().manual_seed(0)
    mbs, n_mb = args.micro_batch_size, 2
    steps = []
    for _ in range(args.drift_steps):
        data = torch.randint(4, cfg.vocab_size, (n_mb, mbs, args.seq + 1), generator=g)
        steps.append(
            [
                {"tokens": d[:, :-1], "labels": d[:, 1:], "loss_mask": torch.ones(mbs, args.seq)}
                for d in data
            ]
        )
    out: dict[str, Any] = {}
    for name, tp in (("1 process", 1), ("TP2", 2)):
        if tp == 1 and dist.get_rank() != 0:
            continue
        pconf = ParallelConfig(tensor_parallel=tp)
        dims = ParallelDims.from_config(pconf, tp)
        mesh = dims.build_mesh("cpu") if tp > 1 else None
        engine = ParallelEngine(
            pconf,
            cfg,
            dims,
            mesh,
            device=torch.device("cpu"),
            seed=0,
            exact_sync=True,
            canonical_degree=args.degree,
        )
        opts = OptimizersContainer(
            engine.model_parts, lambda p: build_adamw([p], lr=2e-3, weight_decay=0.1)
        )
        losses = []
        for micro in steps:
            opts.zero_grad()
            losses.append(float(engine.forward_backward(micro, step=GPTTrainStep())))
            engine.clip_grad_norm(1.0)
            opts.step()
        params = {
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in engine.model_parts[0].named_parameters()
        }
        out[name] = (losses, params)
    dist.barrier()
    if dist.get_rank() != 0:
        return {}
    (a, pa), (b, pb) = out["1 process"], out["TP2"]
    diffs = [abs(x - y) for x, y in zip(a, b)]
    weight = max(float((pa[n] - pb[n]).abs().max() / pa[n].abs().max()) for n in pa)
    return {
        "equal_steps": sum(x == y for x, y in zip(a, b)),
        "first_diff": next((i + 1 for i, d in enumerate(diffs) if d), None),
        "max_abs": max(diffs),
        "max_rel": max(d / abs(x) for d, x in zip(diffs, a)),
        "last": (a[-1], b[-1]),
        "weight_rel": weight,
    }


def _setup(args: argparse.Namespace, world: int) -> None:
    """This rank's threads (cores / processes unless ``--threads``) and GPU."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    if args.device == "cuda":
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())


def run(world: int, fn: Any, *args: Any, timeout: float) -> Any:
    """``fn(rank, world, *args)`` on ``world`` spawned gloo processes; rank 0's result."""
    return run_gloo(fn, world, *args, timeout=timeout)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,esm2-8m")
    parser.add_argument("--dp", default="2,4", help="data-parallel sizes")
    parser.add_argument("--sharding", default="none", help="dp_sharding modes, comma-separated")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=8, help="per step, all ranks")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="per process (0: cores / DP)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every row")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism with --tp")
    parser.add_argument("--cp", type=int, default=1, help="context-parallel size of every row")
    parser.add_argument(
        "--degree",
        type=int,
        default=8,
        help="parallel.invariant_degree of the invariant mode (0: data-parallel rule only)",
    )
    parser.add_argument(
        "--accumulation",
        choices=["step", "micro_batch"],
        default="step",
        help="parallel.invariant_context_accumulation of the invariant mode (with --cp)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--drift-steps",
        type=int,
        default=0,
        help="only measure TP2 against one process over this many steps (tiny GPT, no dropout)",
    )
    args = parser.parse_args()
    if args.drift_steps:
        d = run(2, _tp_drift, args, timeout=args.timeout)
        print(
            f"tiny GPT, {args.drift_steps} steps of 2 micro-batches of {args.micro_batch_size} x "
            f"{args.seq} tokens, TP2 against one process (both layout-invariant):\n"
            f"  losses bit-equal at {d['equal_steps']} of {args.drift_steps} steps "
            f"(first difference at step {d['first_diff']})\n"
            f"  largest loss difference {d['max_abs']:.3g} (relative {d['max_rel']:.3g}); "
            f"last step {d['last'][0]:.6f} vs {d['last'][1]:.6f}\n"
            f"  final weights: largest difference {d['weight_rel']:.3g} of the tensor's largest value"
        )
        return
    print(
        f"global batch {args.micro_batches} micro-batches of {args.micro_batch_size} x {args.seq} "
        f"tokens; {args.steps} timed steps per mode after {args.warmup}, alternating; "
        f"device {args.device}, {os.cpu_count()} CPU cores; median step time (slowest rank)"
    )
    header = (
        f"{'shape':<9} {'layout':<15} {'sharding':<9} {'plain s':>8} {'invariant s':>11} "
        f"{'ratio':>6} {'plain MiB':>9} {'inv. MiB':>9}"
    )
    print(header)
    print("-" * len(header))
    for shape in args.shapes.split(","):
        for dp in (int(x) for x in args.dp.split(",")):
            for sharding in args.sharding.split(","):
                world = dp * args.tp * args.cp
                times = run(world, _time_both, args, shape, sharding, timeout=args.timeout)
                plain, inv = (statistics.median(times[m]) for m in MODES)
                mem = ["", ""]
                if not args.no_memory:
                    mem = [
                        f"{run(world, _peak_memory, args, shape, sharding, m, timeout=args.timeout):.0f}"
                        for m in MODES
                    ]
                layout = f"DP{dp} x GA{args.micro_batches // dp}"
                if args.cp > 1:
                    layout = f"CP{args.cp} x " + layout
                if args.tp > 1:
                    layout = f"TP{args.tp}{'+SP' if args.sp else ''} x " + layout
                print(
                    f"{shape:<9} {layout:<15} {sharding:<9} {plain:>8.3f} {inv:>11.3f} "
                    f"{inv / plain:>6.3f} {mem[0]:>9} {mem[1]:>9}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
