"""One MoE layer on the CPU: grouped experts against the per-expert loop and transformers' MoE blocks.

Forward and backward of one mixture-of-experts layer (hidden ``--hidden``, each expert's
inner width ``--ffn``, SwiGLU) on ``--tokens`` random tokens, for each number of experts
(``--experts``) and experts per token (``--topk``):

- ``loop``: epochal's ``MoEMLP``, one expert at a time (``model.moe_grouped_gemm=false``);
- ``grouped``: the same layer with ``model.moe_grouped_gemm=true`` (one grouped GEMM per
  projection over the tokens sorted by expert);
- ``qwen3``: transformers' ``Qwen3MoeSparseMoeBlock`` (softmax top-k, renormalised), the
  same shapes;
- ``deepseek``: transformers' ``DeepseekV3MoE`` (sigmoid scores, the balancing bias, the
  routed scaling factor, a shared expert of the experts' width), and epochal's layer
  routed the same way (``grouped-ds``).

Each row is the median of ``--repeats`` timed calls after two warm-up calls, one thread,
in this process; tokens/s is ``--tokens`` over it. Memory is the peak resident memory
(``VmHWM``, reset before the timed calls) above the resident memory before them: what the
calls allocate (activations, gradients, the grouped path's stacked weights), measured in a
second process (``--memory-pass``) under glibc's ``MALLOC_MMAP_THRESHOLD_=131072``, so that
every block of 128 KiB or more is its own mapping, returned when the tensor is freed (the
times come from this process, under the default allocator: that threshold makes every
large allocation a system call, which would time the allocator). The last
column is tokens/s against transformers' block of the same routing.

    python benchmarks/bench_moe.py                                # 8 / 64 / 128 experts, top-2 and top-8
    python benchmarks/bench_moe.py --experts 64 --topk 8 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch
from torch import nn

from epochal.model import ModelConfig
from epochal.model.layers.moe import MoEMLP
from process_memory import reset_peak, rss_mib


def _ours(args: argparse.Namespace, experts: int, topk: int, *, deepseek: bool) -> MoEMLP:
    extra = {}
    if deepseek:
        extra = dict(
            moe_shared_expert_intermediate_size=args.ffn,
            moe_router_score_function="sigmoid",
            moe_router_enable_expert_bias=True,
            moe_router_topk_scaling_factor=2.5,
        )
    cfg = ModelConfig(
        vocab_size=64,
        hidden_size=args.hidden,
        num_layers=1,
        num_attention_heads=4,
        max_position_embeddings=64,
        activation="swiglu",
        add_bias_linear=False,
        num_experts=experts,
        moe_router_topk=topk,
        moe_ffn_hidden_size=args.ffn,
        **extra,
    )
    layer = MoEMLP(cfg)
    for p in layer.parameters():
        nn.init.normal_(p, std=0.02)
    return layer


def _hf(args: argparse.Namespace, experts: int, topk: int, *, deepseek: bool) -> nn.Module:
    warnings.simplefilter("ignore")
    if deepseek:
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        cfg = DeepseekV3Config(
            hidden_size=args.hidden,
            moe_intermediate_size=args.ffn,
            n_routed_experts=experts,
            n_shared_experts=1,
            num_experts_per_tok=topk,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            hidden_act="silu",
        )
        block: nn.Module = DeepseekV3MoE(cfg)
    else:
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        cfg = Qwen3MoeConfig(
            hidden_size=args.hidden,
            moe_intermediate_size=args.ffn,
            num_experts=experts,
            num_experts_per_tok=topk,
            norm_topk_prob=True,
        )
        block = Qwen3MoeSparseMoeBlock(cfg)
    for p in block.parameters():
        nn.init.normal_(p, std=0.02)
    return block


def _measure(module: nn.Module, x: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Median seconds of a forward + backward, and the MiB the timed calls allocated."""

    def call() -> None:
        module.zero_grad(set_to_none=True)
        out = module(x)
        out = out[0] if isinstance(out, tuple) else out
        out.float().square().mean().backward()

    for _ in range(2):
        call()
    module.zero_grad(set_to_none=True)
    reset_peak()  # the peak resident memory from here
    base = rss_mib("VmRSS")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), rss_mib("VmHWM") - base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", default="8,64,128")
    parser.add_argument("--topk", default="2,8")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    memory = _memory(args) if not args.memory_pass else {}
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(1, args.tokens, args.hidden, requires_grad=True)
    if args.memory_pass:
        _run_all(args, x, {})
        return
    print(
        f"one MoE layer, forward + backward: {args.tokens} tokens, hidden {args.hidden}, "
        f"experts' width {args.ffn}, SwiGLU; 1 thread; median of {args.repeats}"
    )
    print("| experts | top-k | layer | ms | tokens/s | memory (MiB) | vs transformers |")
    print("|---|---|---|---|---|---|---|")
    _run_all(args, x, memory)


def _memory(args: argparse.Namespace) -> dict[tuple[int, int, str], float]:
    """Each row's memory from a second process under ``MALLOC_MMAP_THRESHOLD_`` (module docstring)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    command = [sys.executable, __file__, "--memory-pass", *sys.argv[1:]]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    out = {}
    for line in done.stdout.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0].isdigit():
            out[(int(fields[0]), int(fields[1]), fields[2])] = float(fields[3])
    return out


def _run_all(
    args: argparse.Namespace, x: torch.Tensor, memory: dict[tuple[int, int, str], float]
) -> None:
    for experts in (int(v) for v in args.experts.split(",")):
        for topk in (int(v) for v in args.topk.split(",")):
            rows: list[tuple[str, float, float]] = []
            for name in LAYERS:
                layer = _build(name, args, experts, topk)
                seconds, mib = _measure(layer, x, 1 if args.memory_pass else args.repeats)
                if args.memory_pass:
                    print(f"{experts} {topk} {name} {mib:.1f}", flush=True)
                rows.append((name, seconds, memory.get((experts, topk, name), mib)))
            if args.memory_pass:
                continue
            reference = {"qwen3": rows[0][1], "deepseek": rows[3][1]}
            for name, seconds, mib in rows:
                base = reference["deepseek" if name.endswith("ds") else "qwen3"]
                speed = f"{base / seconds:.2f}x" if name not in reference else ""
                print(
                    f"| {experts} | {topk} | {name} | {seconds * 1000:.1f} | "
                    f"{args.tokens / seconds:,.0f} | {mib:.0f} | {speed} |"
                )


#: the rows of each shape, in order (module docstring)
LAYERS = ("qwen3", "loop", "grouped", "deepseek", "grouped-ds")


def _build(name: str, args: argparse.Namespace, experts: int, topk: int) -> nn.Module:
    deepseek = name in ("deepseek", "grouped-ds")
    if name in ("qwen3", "deepseek"):
        return _hf(args, experts, topk, deepseek=deepseek)
    layer = _ours(args, experts, topk, deepseek=deepseek)
    layer.grouped_gemm = name != "loop"
    return layer


if __name__ == "__main__":
    main()
