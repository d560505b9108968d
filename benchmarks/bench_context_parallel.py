"""Context parallelism on CPU: peak memory per rank and tokens/s at CP 1, 2 and 4 for long sequences.

A GPT with a small hidden size (so that one CPU trains a 8192-token sequence in
seconds) runs ``--steps`` training steps (forward, backward, AdamW) after one
warmup step through :class:`epochal.parallel.engine.ParallelEngine` with
``parallel.context_parallel = 1, 2, 4``: each layout is one spawned gloo group
(1 thread per process). Every rank reports its peak resident memory
(``VmHWM``, reset before the first step), the resident memory before the first step
(model, optimizer state, torch itself) and their difference: what the training steps
themselves needed (activations, gradients, attention masks, communication buffers).
AdamW creates its state in its first step, so one step on zero gradients creates it
before the measure. tokens/s is
the global batch's tokens over the mean step time.

Memory is glibc's resident set, so the ranks start with ``MALLOC_MMAP_THRESHOLD_=131072``
(unless ``--allocator-default`` or the variable is set already): every block of 128 KiB
or more is its own mapping, returned when the tensor is freed, so the peak counts the
tensors alive at once. glibc's default threshold grows with the blocks freed, after which
large tensors come from the heap and freed ones stay resident; the peak then also counts
where they happened to fall (fragmentation), and varies from layout to layout.

Each CP > 1 runs with every
exchange of ``--exchange`` (``parallel.context_parallel_exchange``: ``allgather``,
``a2a``, ``p2p``); the last column is the step memory against CP1's divided by CP (1.00:
memory that falls as 1 / CP).

    python benchmarks/bench_context_parallel.py                    # seq 8192, CP 1/2/4
    python benchmarks/bench_context_parallel.py --seq 16384 --cp 1,2 --exchange a2a
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

from epochal.model import ModelConfig
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.parallel.engine import ParallelEngine
from epochal.train.optim.optimizer import OptimizersContainer, build_adamw
from epochal.train.steps.gpt import GPTTrainStep
from process_memory import reset_peak, rss_mib


def _prime_optimizer(parts: list[torch.nn.Module], opts: OptimizersContainer) -> None:
    """Create AdamW's state (it does so in its first step) by one step on zero gradients."""
    for part in parts:
        for p in part.parameters():
            p.grad = torch.zeros_like(p)
    opts.step()
    opts.zero_grad(set_to_none=True)


def _model(args: argparse.Namespace) -> ModelConfig:
    return ModelConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=args.seq,
        position_embedding_type="rope",
        make_vocab_size_divisible_by=64,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _rank(
    rank: int, world: int, port: int, args: argparse.Namespace, exchange: str, out: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pc = ParallelConfig(context_parallel=world, context_parallel_exchange=exchange)
        dims = ParallelDims.from_config(pc, world)
        engine = ParallelEngine(
            pc, _model(args), dims, dims.build_mesh("cpu"), device=torch.device("cpu"), seed=0
        )
        opts = OptimizersContainer(
            engine.model_parts, lambda p: build_adamw([p], lr=1e-3, weight_decay=0.1)
        )
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 512, (1, args.seq + 1), generator=g)
        batch = {
            "tokens": tokens[:, :-1],
            "labels": tokens[:, 1:],
            "loss_mask": torch.ones(1, args.seq),
        }
        _prime_optimizer(engine.model_parts, opts)
        base = rss_mib("VmRSS")
        reset_peak()
        times = []
        for i in range(args.steps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            opts.zero_grad(set_to_none=True)
            engine.forward_backward([batch], step=GPTTrainStep())
            opts.step()
            dist.barrier()
            if i:  # the first step is warmup
                times.append(time.perf_counter() - t0)
        out.put((rank, base, rss_mib("VmHWM"), sum(times) / len(times)))
    except BaseException as exc:  # noqa: BLE001 - the parent must not wait for a dead rank
        out.put((rank, repr(exc), 0.0, 0.0))
        raise
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    cp: int, args: argparse.Namespace, exchange: str = "allgather"
) -> list[tuple[int, float, float, float]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, cp, port, args, exchange, out)) for r in range(cp)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=1800) for _ in range(cp))
    for p in procs:
        p.join(timeout=60)
    failed = [r for r in results if isinstance(r[1], str)]
    if failed:
        raise RuntimeError(f"CP{cp}: rank {failed[0][0]} failed: {failed[0][1]}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--cp", default="1,2,4")
    parser.add_argument("--exchange", default="allgather,a2a,p2p", help="exchanges for CP > 1")
    parser.add_argument(
        "--allocator-default",
        action="store_true",
        help="keep glibc's own mmap threshold (the peak then counts fragmentation too)",
    )
    args = parser.parse_args()
    if not args.allocator_default:  # read by glibc when each spawned rank starts
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    print(
        f"GPT hidden {args.hidden}, {args.layers} layers, {args.heads} heads, RoPE; one sequence "
        f"of {args.seq} tokens per step; {args.steps} timed steps; 1 thread per process; "
        f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'glibc default')}"
    )
    print(
        "| CP | exchange | peak RSS per rank (MiB) | step memory per rank (MiB) | tokens/s "
        "| step memory / (CP1's / CP) |"
    )
    print("|---|---|---|---|---|---|")
    one = None
    for cp in (int(x) for x in args.cp.split(",")):
        for exchange in ["allgather"] if cp == 1 else args.exchange.split(","):
            res = run(cp, args, exchange)
            peak = max(r[2] for r in res)
            step = max(r[2] - r[1] for r in res)
            secs = max(r[3] for r in res)
            one = step if cp == 1 else one
            ratio = f"{step / (one / cp):.2f}" if one else ""
            name = "(one process)" if cp == 1 else exchange
            print(
                f"| {cp} | {name} | {peak:,.0f} | {step:,.0f} | {args.seq / secs:,.0f} | {ratio} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
