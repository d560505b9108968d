"""Packed sequences (THD) vs padded batches: real (non-pad) tokens per second of ESM training steps.

Protein lengths follow a log-normal distribution (median ``--median`` residues,
``--sigma``; UniRef50-like: median about 300, a long tail), plus ``<cls>``/``<eos>``,
cropped to ``--max-seq-length``. Each micro-batch of ``--micro-batch`` proteins
is trained on (forward, masked-LM loss, backward) three ways, on the same samples
and the same model weights:

- ``padded to max_seq_length``: what a fixed-length masked-LM dataset gives
  (epochal's BERT/ESM samples, BioNeMo's ``min_seq_length = max_seq_length``);
- ``padded to longest``: padded to the batch's longest protein (dynamic padding);
- ``packed``: :func:`epochal.data.loading.packing.pack_padded_batch`, one row of
  the real tokens, ``BertModel(..., cu_seqlens=...)`` (the packing is timed too).

Only real tokens are counted, so the figure is useful work per second. Runs
alternate between the modes (one step each, round robin) and each mode's median
step time is reported, so machine noise hits all alike. The last column is the
largest difference between a mode's loss and the padded loss over the measured
steps (the same numbers up to float rounding).

    python benchmarks/bench_packing.py                     # tiny ESM, CPU, about 1 minute
    python benchmarks/bench_packing.py --model esm2-8m --steps 4
    python benchmarks/bench_packing.py --threads 1 --clock cpu   # on a shared, busy machine
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from epochal.data.loading.packing import pack_padded_batch
from epochal.model import ModelConfig, build_model
from epochal.model.flops import training_flops_per_token
from epochal.train.observe.throughput import device_name, peak_tflops

#: model shapes: (layers, hidden, heads, ffn)
MODELS = {
    "tiny": (2, 64, 4, 256),
    "esm2-8m": (6, 320, 20, 1280),
    "esm2-650m": (33, 1280, 20, 5120),
}
VOCAB, CLS, EOS, MASK = 33, 0, 2, 32


def esm_config(name: str, max_seq_length: int) -> ModelConfig:
    """An ESM-2-shaped config (rotary, pre-LN, token dropout) of the named size."""
    layers, hidden, heads, ffn = MODELS[name]
    return ModelConfig(
        type="esm",
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_attention_heads=heads,
        ffn_hidden_size=ffn,
        max_position_embeddings=max_seq_length,
        position_embedding_type="rope",
        num_tokentypes=0,
        token_dropout=True,
        mask_token_id=MASK,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def protein_lengths(n: int, median: float, sigma: float, max_len: int, seed: int) -> list[int]:
    """``n`` sample lengths: log-normal residues + ``<cls>``/``<eos>``, cropped to ``max_len``."""
    g = torch.Generator().manual_seed(seed)
    residues = torch.exp(math.log(median) + sigma * torch.randn(n, generator=g))
    return [min(max(int(r), 1) + 2, max_len) for r in residues.tolist()]


def padded_batch(lengths: list[int], max_len: int, seed: int) -> dict[str, torch.Tensor]:
    """Masked-LM samples padded to ``max_len``: 15% of residues masked (80% ``<mask>``)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    real = torch.arange(max_len)[None] < torch.tensor(lengths)[:, None]
    tokens = torch.randint(4, 24, (b, max_len), generator=g)
    tokens[:, 0] = CLS
    tokens[torch.arange(b), torch.tensor(lengths) - 1] = EOS
    residue = real & (tokens != CLS) & (tokens != EOS)
    selected = residue & (torch.rand(b, max_len, generator=g) < 0.15)
    labels = torch.where(selected, tokens, -100)
    masked = selected & (torch.rand(b, max_len, generator=g) < 0.8)
    tokens = torch.where(masked, MASK, tokens) * real + 1 * ~real  # <pad> = 1
    return {
        "tokens": tokens,
        "labels": labels,
        "loss_mask": selected.long(),
        "padding_mask": real.long(),
    }


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], bf16: bool = False) -> float:
    """Forward, masked-LM loss (token mean over ``loss_mask``), backward; the loss.

    ``bf16``: the forward under bfloat16 autocast (the loss in float32).
    """
    kwargs = {"padding_mask": batch["padding_mask"]}
    if "cu_seqlens" in batch:
        kwargs["cu_seqlens"] = batch["cu_seqlens"]
    device = batch["tokens"].device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch["tokens"], **kwargs)
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), batch["labels"].clamp(min=0).flatten(), reduction="none"
    )
    mask = batch["loss_mask"].flatten().float()
    loss = (losses * mask).sum() / mask.sum().clamp(min=1.0)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def to_longest(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch cut to its longest sample (dynamic padding)."""
    longest = int(batch["padding_mask"].sum(1).max())
    return {k: v[:, :longest] for k, v in batch.items()}


MODES: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]] = {
    "padded to max_seq_length": lambda batch: batch,
    "padded to longest": to_longest,
    "packed": pack_padded_batch,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--max-seq-length", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--median", type=float, default=300.0, help="median residues")
    parser.add_argument("--sigma", type=float, default=0.6, help="log-normal sigma")
    parser.add_argument("--steps", type=int, default=8, help="measured steps per mode")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast (GPU)")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="MFU against this peak (default: the GPU's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    config = esm_config(args.model, args.max_seq_length)
    with device:
        model = build_model(config, seed=args.seed)
    steps = args.steps + 1  # the first step of each mode warms up
    lengths = protein_lengths(
        steps * args.micro_batch, args.median, args.sigma, args.max_seq_length, args.seed
    )
    batches = [
        padded_batch(
            lengths[i * args.micro_batch : (i + 1) * args.micro_batch],
            args.max_seq_length,
            args.seed + i,
        )
        for i in range(steps)
    ]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    losses: dict[str, list[float]] = {mode: [] for mode in MODES}
    for step, batch in enumerate(batches):
        for mode, prepare in MODES.items():
            sync()
            start = clock()
            inputs = {k: v.to(device) for k, v in prepare(batch).items()}
            loss = train_step(model, inputs, args.bf16)
            sync()
            if step:
                times[mode].append(clock() - start)
                losses[mode].append(loss)

    real = [
        sum(lengths[i * args.micro_batch : (i + 1) * args.micro_batch]) for i in range(1, steps)
    ]
    real_per_step = statistics.median(real)
    # useful FLOPs per step: the PaLM formula per protein, its attention term at the protein's own
    # length, so every mode is credited with the same work (MFU over real tokens)
    useful = [
        sum(
            n * training_flops_per_token(config, n)
            for n in lengths[i * args.micro_batch : (i + 1) * args.micro_batch]
        )
        for i in range(1, steps)
    ]
    flops_per_step = statistics.median(useful)
    peak = peak_tflops(device, args.peak_tflops)
    print(
        f"ESM {args.model} {MODELS[args.model]} (layers, hidden, heads, ffn) on {device.type}, "
        f"{torch.get_num_threads()} threads, {args.clock} clock; micro-batch {args.micro_batch}, "
        f"max_seq_length {args.max_seq_length}; {'bf16' if args.bf16 else 'fp32'}; "
        f"{device_name(device)}, peak {peak or '-'} TFLOP/s; lengths log-normal median {args.median:.0f} "
        f"sigma {args.sigma} (+2, cropped): mean {statistics.mean(lengths):.0f}, "
        f"max {max(lengths)}; {args.steps} steps per mode, median step time"
    )
    print(
        f"real tokens per step (median): {real_per_step:.0f} of "
        f"{args.micro_batch * args.max_seq_length} padded"
    )
    print()
    print(
        "| mode                      | step time  | real tokens/s | speed-up | MFU (real) "
        "| max loss diff |"
    )
    print(
        "|---------------------------|------------|---------------|----------|------------"
        "|---------------|"
    )
    base = statistics.median(times["padded to max_seq_length"])
    for mode in MODES:
        t = statistics.median(times[mode])
        diff = max(
            abs(a - b)
            for a, b in zip(losses[mode], losses["padded to max_seq_length"], strict=True)
        )
        mfu = f"{100 * flops_per_step / t / (peak * 1e12):9.1f}%" if peak else f"{'-':>10}"
        print(
            f"| {mode:<25} | {t * 1e3:7.1f} ms | {real_per_step / t:13,.0f} | "
            f"{base / t:7.2f}x | {mfu} | {diff:13.2e} |"
        )


if __name__ == "__main__":
    main()
