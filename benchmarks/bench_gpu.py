"""GPU throughput (issue 25): ``epochal train`` vs a hand-written loop vs transformers' Llama, and levers.

Same shape everywhere: the ``gpu-1b`` preset's Llama-style 1.34B model (hidden 2048,
24 layers, 16 heads, SwiGLU 5632, vocabulary 50304), 2048 tokens, micro-batch 4 x 8,
bfloat16 autocast, AdamW, gradient clipping. Rows:

- ``epochal train``: the :class:`~epochal.train.trainer.Trainer` with the preset's recipe
  (compiled blocks, loss compiled, fused AdamW) on Megatron's mock corpus;
- ``hand loop, GPTModel``: epochal's model in a hand-written loop, the whole forward and
  the loss under one ``torch.compile``, fused AdamW, random tokens already on the GPU;
- ``hand loop, LlamaForCausalLM``: transformers' Llama (``attn_implementation="sdpa"``)
  in the same loop, compiled and eager;
- one ablation row per lever of the trainer (``training.*``): without compile, without
  the compiled loss, the chunked loss instead, without fused AdamW, the math attention
  kernel, micro-batch 8, and activation recompute (selective / full: memory).

Each row runs in a fresh process (so peak memory is the row's own), ``--warmup`` untimed
steps then ``--steps`` timed ones; tokens/s is over the timed steps (wall clock, the GPU
synchronized at both ends). MFU uses the PaLM formula (:mod:`epochal.model.flops`)
against the GPU's dense bf16 peak (:mod:`epochal.train.observe.throughput`, or
``--peak-tflops``). Peak memory is ``torch.cuda.max_memory_allocated`` (CPU: the
process's peak RSS).

    python benchmarks/bench_gpu.py                       # one GPU, about 15-25 minutes
    python benchmarks/bench_gpu.py --rows trainer,hf-compiled --steps 20
    python benchmarks/bench_gpu.py --tiny                # the tiny shape: runs on a CPU too

Without CUDA (or with ``--device cpu``) only ``--tiny`` runs. Each row's process (and
whatever it starts) dies with the benchmark: ``timeout``, Ctrl-C or a kill of the
parent leave nothing running (:mod:`child_processes`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from child_processes import install_cleanup, run_child
from epochal.model import GPTModel
from epochal.model.flops import training_flops_per_token
from epochal.train.config import build_config, model_config_from_section
from epochal.train.observe.throughput import device_name, peak_tflops
from epochal.train.optim.optimizer import param_groups

#: row key -> (label, kind, trainer overrides)
ROWS: dict[str, tuple[str, str, list[str]]] = {
    "trainer": ("`epochal train` (gpu-1b recipe)", "trainer", []),
    "loop-ours": ("hand loop, epochal GPTModel, compiled", "loop-ours", []),
    "hf-compiled": ("hand loop, transformers LlamaForCausalLM (sdpa), compiled", "loop-hf", []),
    "hf-eager": ("hand loop, transformers LlamaForCausalLM (sdpa), eager", "loop-hf-eager", []),
    "no-compile": (
        "ablation: trainer eager (training.compile=false)",
        "trainer",
        ["--training.compile=false", "--training.compile_loss=false"],
    ),
    "no-compile-loss": (
        "ablation: trainer, loss not compiled (fp32 [b, s, V] logits)",
        "trainer",
        ["--training.compile_loss=false"],
    ),
    "chunked-loss": (
        "ablation: trainer, chunked loss (loss_chunk_tokens=2048) instead",
        "trainer",
        ["--training.compile_loss=false", "--training.loss_chunk_tokens=2048"],
    ),
    "no-fused-adamw": (
        "ablation: trainer, AdamW not fused",
        "trainer",
        ["--training.fused_adamw=false"],
    ),
    "math-attention": (
        "ablation: trainer, math attention kernel (attention_backend=math)",
        "trainer",
        ["--training.attention_backend=math"],
    ),
    "mbs8": (
        "ablation: trainer, micro-batch 8 (full shape: 8 x 4)",
        "trainer",
        ["--training.micro_batch_size=8"],
    ),
    "recompute-selective": (
        "ablation: trainer, selective recompute",
        "trainer",
        ["--parallel.recompute_granularity=selective"],
    ),
    "recompute-full": (
        "ablation: trainer, full recompute",
        "trainer",
        ["--parallel.recompute_granularity=full"],
    ),
}

TINY = [
    "--model.vocab_size=512",
    "--model.hidden_size=64",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=4",
    "--model.ffn_hidden_size=176",
    "--data.seq_length=64",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=8",  # the mbs8 row: 8 x 1
]


def config(args: argparse.Namespace, run_dir: str, extra: list[str]):
    """The ``gpu-1b`` preset (or its tiny shape) with the benchmark's overrides."""
    overrides = [
        f"--run_dir={run_dir}",
        f"--training.device={args.device}",
        f"--training.train_iters={args.warmup + args.steps}",
        "--training.eval_interval=0",
        "--training.eval_iters=0",
        "--checkpoint.save_interval=0",
        "--checkpoint.save_final=false",
        "--logging.progress=false",
        "--logging.tensorboard=false",
        "--scheduler.lr_warmup_iters=1",
        *(TINY if args.tiny else []),
        *([f"--training.micro_batch_size={args.micro_batch}"] if args.micro_batch else []),
        *([] if args.device == "cuda" else ["--training.bf16=false"]),
        *(["--training.compile=false", "--training.compile_loss=false"] if args.eager else []),
        *extra,
    ]
    return build_config(preset="gpu-1b", overrides=overrides)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_trainer(args: argparse.Namespace, extra: list[str]) -> tuple[float, str]:
    """tokens/s of ``epochal train``'s Trainer over the timed steps, and a profile summary.

    With ``--profile``, two more steps run after the timed ones under ``logging.profile_steps``
    (so the timed steps are not slowed) and their trace is summarised
    (:mod:`trace_summary`: GPU busy/idle time, kernel time by kind); else the summary is "".
    """
    from epochal.train.trainer import Trainer

    last = args.warmup + args.steps
    profile = (
        [f"--training.train_iters={last + 2}", f"--logging.profile_steps=[{last + 1}, {last + 2}]"]
        if args.profile
        else []
    )
    summary = ""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(args, tmp, [*extra, *profile])
        trainer = Trainer(cfg, log=False)
        stamps: list[float] = []

        def stamp(tr: Any, step: int, rec: dict) -> None:
            _sync(tr.device)
            stamps.append(time.perf_counter())

        trainer.add_callback(stamp)
        trainer.train()
        if args.profile:
            from trace_summary import summarize

            traces = sorted((Path(tmp) / "profile").glob("trace_steps_*.json"))
            summary = "\n".join(summarize(t) for t in traces) or "no trace written"
            if args.keep_trace:
                import gzip
                import shutil

                Path(args.keep_trace).mkdir(parents=True, exist_ok=True)
                for trace in traces:
                    with (
                        trace.open("rb") as src,
                        gzip.open(
                            Path(args.keep_trace) / f"{args.row}-{trace.name}.gz", "wb"
                        ) as dst,
                    ):
                        shutil.copyfileobj(src, dst)
    tokens = cfg.training.global_batch_size * cfg.data.seq_length
    return args.steps * tokens / (stamps[last - 1] - stamps[args.warmup - 1]), summary


def _hf_llama(mc: Any) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=mc.padded_vocab_size,
        hidden_size=mc.hidden_size,
        intermediate_size=mc.ffn_size,
        num_hidden_layers=mc.num_layers,
        num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_kv_heads,
        max_position_embeddings=mc.max_position_embeddings,
        rms_norm_eps=mc.norm_epsilon,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(hf)


def run_loop(args: argparse.Namespace, kind: str) -> float:
    """tokens/s of a hand-written loop (our model or transformers' Llama)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(args, tmp, [])
    t = cfg.training
    device = torch.device(args.device)
    mc = model_config_from_section(
        cfg.model, vocab_size=cfg.model.vocab_size, seq_length=cfg.data.seq_length
    )
    with torch.device(device):
        model = GPTModel(mc, seed=1) if kind == "loop-ours" else _hf_llama(mc)
    is_hf = kind != "loop-ours"
    groups = param_groups([model])
    for g in groups:
        g["weight_decay"] = cfg.optimizer.weight_decay * g["wd_mult"]
    opt = torch.optim.AdamW(
        groups, lr=cfg.optimizer.lr, betas=(0.9, 0.95), fused=t.fused_adamw or None
    )

    def loss_of(tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = model(tokens)
        logits = out.logits if is_hf else out
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())

    step_loss = torch.compile(loss_of) if kind != "loop-hf-eager" and t.compile else loss_of
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=t.bf16)
    n_mb = t.global_batch_size // t.micro_batch_size
    g = torch.Generator(device=device).manual_seed(0)
    shape = (t.micro_batch_size, cfg.data.seq_length + 1)
    batches = [torch.randint(0, mc.vocab_size, shape, generator=g, device=device) for _ in range(4)]
    t0 = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            _sync(device)
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for i in range(n_mb):
            b = batches[(step * n_mb + i) % len(batches)]
            with amp:
                loss = step_loss(b[:, :-1], b[:, 1:]) / n_mb
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optimizer.clip_grad)
        opt.step()
    _sync(device)
    return args.steps * t.global_batch_size * cfg.data.seq_length / (time.perf_counter() - t0)


def measure_row(args: argparse.Namespace, key: str) -> dict[str, Any]:
    """Run one row in this process; its numbers as a dict."""
    _, kind, extra = ROWS[key]
    device = torch.device(args.device)
    summary = ""
    if kind == "trainer":
        rate, summary = run_trainer(args, extra)
    else:
        rate = run_loop(args, kind)
    if device.type == "cuda":
        peak_gib = torch.cuda.max_memory_allocated(device) / 1024**3
    else:
        peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    return {"tokens_per_s": rate, "peak_gib": peak_gib, "profile": summary}


def _row_in_subprocess(args: argparse.Namespace, key: str) -> dict[str, Any]:
    """One row in a child process that dies with this one (:mod:`child_processes`)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--row", key, *args.passthrough]
    _, out, err = run_child(cmd, timeout=args.row_timeout)
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (err.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:120]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shape (2 layers, 64 wide)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--steps", type=int, default=0, help="timed steps (default 10; tiny 3)")
    parser.add_argument("--warmup", type=int, default=0, help="untimed steps (default 5; tiny 2)")
    parser.add_argument("--rows", default="", help="comma-separated row keys (default: all)")
    parser.add_argument("--eager", action="store_true", help="no torch.compile anywhere")
    parser.add_argument(
        "--micro-batch", type=int, default=0, help="micro-batch size of every row (default: preset)"
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the peak")
    parser.add_argument("--row-timeout", type=float, default=1800.0, help="seconds per row")
    parser.add_argument(
        "--profile", action="store_true", help="trainer rows: profile 2 extra steps, summarise"
    )
    parser.add_argument("--keep-trace", default="", help="with --profile: gzip traces into DIR")
    parser.add_argument("--row", default="", help=argparse.SUPPRESS)  # internal: one row
    args = parser.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device != "cuda" and not args.tiny:
        parser.error(
            "the gpu-1b shape (1.34B parameters, bf16) needs a CUDA GPU, and "
            f"{'none is available' if not torch.cuda.is_available() else '--device is cpu'}; "
            "run with --tiny for the tiny shape on the CPU"
        )
    args.steps = args.steps or (3 if args.tiny else 10)
    args.warmup = max(1, args.warmup or (2 if args.tiny else 5))
    args.passthrough = [
        f"--device={args.device}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        *(["--tiny"] if args.tiny else []),
        *(["--eager"] if args.eager else []),
        *([f"--micro-batch={args.micro_batch}"] if args.micro_batch else []),
        *(["--profile"] if args.profile else []),
        *([f"--keep-trace={args.keep_trace}"] if args.keep_trace else []),
    ]
    if args.row:
        print(json.dumps(measure_row(args, args.row)), flush=True)
        return
    install_cleanup()  # rows never outlive this process (timeout, Ctrl-C, kill)
    keys = [k for k in args.rows.split(",") if k] or list(ROWS)
    unknown = [k for k in keys if k not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(args, tmp, [])
    mc = model_config_from_section(
        cfg.model, vocab_size=cfg.model.vocab_size, seq_length=cfg.data.seq_length
    )
    flops = training_flops_per_token(mc, cfg.data.seq_length)
    peak = peak_tflops(device, args.peak_tflops)
    t = cfg.training
    with torch.device("meta"):
        n_params = GPTModel(mc).num_parameters(exclude_embeddings=True)
    print(
        f"{device_name(device)}; torch {torch.__version__}; model {n_params / 1e6:,.1f}M "
        f"(+ embeddings), L{mc.num_layers} h{mc.hidden_size} heads {mc.num_attention_heads} "
        f"ffn {mc.ffn_size} vocab {mc.padded_vocab_size}; seq {cfg.data.seq_length}; "
        f"micro-batch {t.micro_batch_size} x {t.global_batch_size // t.micro_batch_size}; "
        f"{'bf16' if t.bf16 else 'fp32'}; {'eager (--eager)' if args.eager else 'compiled'}; "
        f"{args.warmup} + {args.steps} steps; "
        f"{flops / 1e9:.2f} GFLOP/token; peak {peak or '-'} TFLOP/s",
        flush=True,
    )
    mem = "peak allocated GiB" if device.type == "cuda" else "peak RSS GiB"
    print(f"| run | tokens/s | MFU | {mem} |")
    print("|---|---|---|---|")
    profiles: list[str] = []
    for key in keys:
        out = _row_in_subprocess(args, key)
        label = ROWS[key][0]
        if "error" in out:
            print(f"| {label} | failed: {out['error']} | - | - |", flush=True)
            continue
        rate = out["tokens_per_s"]
        mfu = f"{100 * rate * flops / (peak * 1e12):.1f}%" if peak else "-"
        print(f"| {label} | {rate:,.0f} | {mfu} | {out['peak_gib']:.2f} |", flush=True)
        if out.get("profile"):
            profiles.append(f"{label}:\n{out['profile']}")
    for text in profiles:
        print(f"\n{text}")


if __name__ == "__main__":
    main()
