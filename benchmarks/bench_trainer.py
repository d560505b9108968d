"""Trainer throughput: epochal's Trainer vs a plain hand-written PyTorch loop, same model/data/batch.

Both sides train the same GPTModel (same seed) with AdamW, gradient accumulation
over the same micro-batches, gradient clipping and an LR schedule, on the same
in-memory token samples fed by a DataLoader. The plain loop has none of the
trainer's bookkeeping (Megatron sampler, scheduler object, metrics JSONL, per-step
loss sync). Runs alternate (plain, trainer, plain, trainer, ...) and the median
tokens/s of each side is reported, so machine noise hits both alike.

On CPU (default) the tiny preset's model is used. With CUDA, the script also
measures a GPT-2-small-sized model (124M, seq 1024, bf16 autocast) and reports
model FLOPs utilization (PaLM formula, see ``epochal.model.flops``) against the
GPU's dense bf16 peak (``--peak-tflops`` to override the table).

    python benchmarks/bench_trainer.py            # CPU, about 1-2 minutes
    python benchmarks/bench_trainer.py --steps 40 --repeats 5
    python benchmarks/bench_trainer.py --threads 1 --clock cpu   # on a shared, busy machine
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from epochal.model import GPTModel
from epochal.model.flops import training_flops_per_token
from epochal.train.config import build_config, model_config_from_section
from epochal.train.inputs.loaders import make_loaders
from epochal.train.observe.throughput import peak_tflops
from epochal.train.trainer import Trainer


class RandomTokens:
    """``n`` samples of ``seq`` random ids (a fixed generator): GPT-style dicts."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq + 1), generator=g)
        self.seq = seq

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.data[int(i)]
        return {"tokens": row[:-1], "labels": row[1:], "loss_mask": torch.ones(self.seq)}


def make_config(args: argparse.Namespace, run_dir: str, gpu: bool):
    overrides = [
        f"--run_dir={run_dir}",
        "--data.corpus=",
        "--data.mock=true",
        f"--training.train_iters={args.steps + args.warmup}",
        "--training.eval_interval=0",
        "--training.eval_iters=0",
        "--checkpoint.save_interval=0",
        "--checkpoint.save_final=false",
        "--logging.progress=false",
        "--logging.tensorboard=false",
        "--scheduler.lr_warmup_iters=2",
        f"--training.device={'cuda' if gpu else 'cpu'}",
    ]
    if gpu:
        overrides += [
            f"--training.micro_batch_size={args.gpu_mbs}",
            f"--training.global_batch_size={args.gpu_mbs * 2}",
            "--training.bf16=true",
            "--model.hidden_dropout=0.0",
            "--model.attention_dropout=0.0",
        ]
        return build_config(preset="gpt2-small", overrides=overrides)
    return build_config(preset="tiny", overrides=overrides)


CLOCK = time.perf_counter  # --clock cpu switches to process CPU time (robust on a shared machine)


def plain_loop(cfg, dataset, vocab: int, steps: int, warmup: int, device: torch.device) -> float:
    """A hand-written loop; returns tokens/s over ``steps`` after ``warmup`` steps."""
    mc = model_config_from_section(cfg.model, vocab_size=vocab, seq_length=cfg.data.seq_length)
    torch.manual_seed(cfg.training.seed)
    with torch.device(device):
        model = GPTModel(mc, seed=cfg.training.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith(".bias")]
    other = [
        p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith(".bias"))
    ]
    o = cfg.optimizer
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=o.lr,
        betas=(o.adam_beta1, o.adam_beta2),
        eps=o.adam_eps,
    )
    total = steps + warmup
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 2) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )
    mbs, gbs = cfg.training.micro_batch_size, cfg.training.global_batch_size
    n_mb = gbs // mbs
    loader = torch.utils.data.DataLoader(dataset, batch_size=mbs, shuffle=False, drop_last=True)
    it = iter(loader)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if cfg.training.bf16 else None
    t0 = 0.0
    for step in range(total):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = CLOCK()
        opt.zero_grad(set_to_none=True)
        for _ in range(n_mb):
            b = next(it)
            tokens, labels = b["tokens"].to(device), b["labels"].to(device)
            if amp is not None:
                with amp:
                    logits = model(tokens)
            else:
                logits = model(tokens)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()) / n_mb
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
        opt.step()
        sched.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * gbs * cfg.data.seq_length / (CLOCK() - t0)


def trainer_loop(cfg, dataset, vocab: int, steps: int, warmup: int) -> float:
    """epochal's Trainer; tokens/s over the steps after ``warmup`` (wall clock between steps)."""
    data = make_loaders(cfg, dataset, None, vocab_size=vocab)
    trainer = Trainer(cfg, data=data, log=False)
    stamps: list[float] = []  # wall clock after each step, everything the loop does included

    def stamp(tr, step, rec):
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(CLOCK())

    trainer.add_callback(stamp)
    trainer.train()
    timed = len(stamps) - warmup
    return (
        timed
        * cfg.training.global_batch_size
        * cfg.data.seq_length
        / (stamps[-1] - stamps[warmup - 1])
    )


def bench(args: argparse.Namespace, gpu: bool) -> tuple[float, float, object, int]:
    device = torch.device("cuda" if gpu else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_config(args, tmp, gpu)
        vocab = 50257 if gpu else 4096
        n = (args.steps + args.warmup) * cfg.training.global_batch_size
        dataset = RandomTokens(n, cfg.data.seq_length, vocab)
        plain, ours = [], []
        for r in range(args.repeats):
            plain.append(plain_loop(cfg, dataset, vocab, args.steps, args.warmup, device))
            run_cfg = make_config(args, f"{tmp}/run{r}", gpu)
            ours.append(trainer_loop(run_cfg, dataset, vocab, args.steps, args.warmup))
        return statistics.median(plain), statistics.median(ours), cfg, vocab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternating runs per side (median reported)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave)")
    parser.add_argument("--gpu-mbs", type=int, default=8, help="micro-batch size of the GPU run")
    parser.add_argument(
        "--peak-tflops", type=float, default=0.0, help="GPU dense bf16 peak (0 = table)"
    )
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU measurement")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall clock, or this process's CPU time (use with --threads 1 on a busy machine)",
    )
    args = parser.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.clock} clock")
    print(
        "| device | model | tokens/step | plain loop tok/s | epochal Trainer tok/s | overhead | MFU |"
    )
    print("|---|---|---|---|---|---|---|")
    plain, ours, cfg, vocab = bench(args, gpu=False)
    _row("CPU", cfg, vocab, plain, ours, mfu=None)
    if torch.cuda.is_available() and not args.no_gpu:
        plain, ours, cfg, vocab = bench(args, gpu=True)
        name = torch.cuda.get_device_name()
        peak = peak_tflops(torch.device("cuda"), args.peak_tflops or None) or 0.0
        mc = model_config_from_section(cfg.model, vocab_size=vocab, seq_length=cfg.data.seq_length)
        flops = training_flops_per_token(mc, cfg.data.seq_length)
        mfu = (ours * flops / (peak * 1e12)) if peak else None
        _row(name, cfg, vocab, plain, ours, mfu)


def _row(device: str, cfg, vocab: int, plain: float, ours: float, mfu: float | None) -> None:
    mc = model_config_from_section(cfg.model, vocab_size=vocab, seq_length=cfg.data.seq_length)
    with torch.device("meta"):
        n_params = GPTModel(mc).num_parameters()
    model = f"{n_params / 1e6:.1f}M, L{mc.num_layers} h{mc.hidden_size} s{cfg.data.seq_length}"
    tokens = cfg.training.global_batch_size * cfg.data.seq_length
    overhead = (plain - ours) / plain * 100
    mfu_s = f"{mfu * 100:.1f}%" if mfu is not None else "-"
    print(
        f"| {device} | {model} | {tokens} | {plain:,.0f} | {ours:,.0f} | {overhead:+.1f}% | {mfu_s} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
