"""Throughput of one Accelerate training script on Hugging Face Accelerate and on ``epochal.accelerate``.

The script is the usual Accelerate causal-LM loop (what ``run_clm_no_trainer.py``
and Accelerate's GPT examples do): a transformers ``LlamaForCausalLM`` (the
``tiny`` preset's shape: 4 layers, hidden 128, GQA, SwiGLU, RoPE, vocabulary
4096, made by epochal's exporter), AdamW with a no-decay group, transformers'
cosine ``get_scheduler``, a shuffled ``DataLoader`` of in-memory random tokens
(16 x 128 tokens a step), and per step ``model(**batch).loss``,
``accelerator.backward``, ``accelerator.clip_grad_norm_(..., 1.0)``,
``optimizer.step``, ``lr_scheduler.step``, ``optimizer.zero_grad`` and
``loss.item()``. It runs word for word twice, once with ``from accelerate import
Accelerator`` (plain PyTorch, one process) and once with ``from epochal.accelerate
import Accelerator``; a third side trains the same model and batches with
``epochal train``'s :class:`~epochal.train.trainer.Trainer` (``--sides`` picks).

Every run is a fresh process with ``torch.set_num_threads(--threads)`` (and
``OMP_NUM_THREADS``); the sides alternate (A, B, C, B, A, C, ...: each repeat
reverses the order, so drift hits all alike), each run times its steps after
the warm-up by the wall clock (all steps) and by the process's CPU time (the median
step: other processes' bursts on a shared machine hit single steps), and the table
gives each side's median tokens/s over the runs, the spread (min-max), the ratio of
medians, and the ratio within each repeat.

    python benchmarks/bench_accelerate.py                   # about 5 minutes on 2 cores
    python benchmarks/bench_accelerate.py --repeats 7 --steps 60 --sides accelerate,epochal
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

VOCAB = 4096
SIDES = {
    "accelerate": "accelerate (Hugging Face)",
    "epochal": "epochal.accelerate",
    "train": "epochal train",
}


class RandomTokens:
    """``n`` samples of ``seq + 1`` random ids; epochal's keys or transformers' (``hf=True``)."""

    def __init__(self, n: int, seq: int, hf: bool, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, VOCAB, (n, seq + 1), generator=g)
        self.seq, self.hf = seq, hf

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.data[int(i)]
        if self.hf:  # transformers shifts inside the loss
            ids = row[:-1]
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
        return {"tokens": row[:-1], "labels": row[1:], "loss_mask": torch.ones(self.seq)}


def make_config(args: argparse.Namespace, run_dir: str):
    from epochal.train.config import build_config

    return build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={run_dir}",
            "--data.corpus=",
            "--data.mock=true",
            f"--training.train_iters={args.steps + args.warmup}",
            f"--training.micro_batch_size={args.batch}",
            f"--training.global_batch_size={args.batch}",
            "--training.layout_invariant=false",
            "--training.eval_interval=0",
            "--training.eval_iters=0",
            "--training.device=cpu",
            "--checkpoint.save_interval=0",
            "--checkpoint.save_final=false",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            "--model.hidden_dropout=0.0",
            "--model.attention_dropout=0.0",
            f"--model.vocab_size={VOCAB}",
        ],
    )


def rate(stamps: list[tuple[float, float]], warmup: int, tokens: int) -> dict[str, float]:
    """Tokens/s over the steps after the warm-up: wall clock over all of them; CPU time of
    the median step (robust to the bursts of other processes on a shared machine)."""
    (w0, _), (w1, _) = stamps[warmup - 1], stamps[-1]
    steps = len(stamps) - warmup
    cpu = [stamps[i][1] - stamps[i - 1][1] for i in range(warmup, len(stamps))]
    return {"wall": steps * tokens / (w1 - w0), "cpu": tokens / statistics.median(cpu)}


def stamp() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def trainer_run(args: argparse.Namespace, run_dir: str) -> dict[str, float]:
    """``epochal train``'s trainer on the same model and batch shape."""
    from epochal.train.inputs.loaders import make_loaders
    from epochal.train.trainer import Trainer

    cfg = make_config(args, run_dir)
    n = (args.steps + args.warmup) * args.batch
    data = make_loaders(cfg, RandomTokens(n, args.seq, hf=False), None, vocab_size=VOCAB)
    trainer = Trainer(cfg, data=data, log=False)
    stamps: list[tuple[float, float]] = []
    trainer.add_callback(lambda tr, step, rec: stamps.append(stamp()))
    trainer.train()
    return rate(stamps, args.warmup, args.batch * args.seq)


def script_run(args: argparse.Namespace, run_dir: str, backend: str) -> dict[str, float]:
    """The Accelerate script; only the ``Accelerator`` import differs between the backends."""
    import transformers

    from epochal.formats.hf.io import EXPORTERS
    from epochal.train.config import model_config_from_section

    if backend == "accelerate":
        from accelerate.utils import set_seed

        from accelerate import Accelerator
    else:
        from epochal.accelerate import Accelerator
        from epochal.accelerate.utils import set_seed

    cfg = make_config(args, run_dir)
    mc = model_config_from_section(cfg.model, vocab_size=VOCAB, seq_length=args.seq)
    hf_config = transformers.LlamaConfig(**EXPORTERS["llama"][0](mc))
    # ---- from here on: the user's script
    accelerator = Accelerator(cpu=True)
    set_seed(1234)
    model = transformers.LlamaForCausalLM(hf_config)
    total_steps = args.steps + args.warmup
    loader = torch.utils.data.DataLoader(
        RandomTokens(total_steps * args.batch, args.seq, hf=True),
        batch_size=args.batch,
        shuffle=True,
    )
    no_decay = ("bias", "norm.weight")
    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": 0.1},
            {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
        ],
        lr=2e-3,
        betas=(0.9, 0.95),
    )
    lr_scheduler = transformers.get_scheduler(
        "cosine", optimizer, num_warmup_steps=total_steps // 10, num_training_steps=total_steps
    )
    model, optimizer, loader, lr_scheduler = accelerator.prepare(
        model, optimizer, loader, lr_scheduler
    )
    model.train()
    stamps: list[tuple[float, float]] = []
    losses: list[float] = []
    for batch in loader:
        outputs = model(**batch)
        loss = outputs.loss
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        stamps.append(stamp())
    accelerator.end_training()
    out = rate(stamps, args.warmup, args.batch * args.seq)
    out["first_loss"], out["last_loss"] = losses[0], losses[-1]
    return out


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.worker == "train":
            out = trainer_run(args, tmp)
        else:
            out = script_run(args, tmp, args.worker)
    print("RESULT " + json.dumps(out), flush=True)


def run_side(side: str, args: argparse.Namespace) -> dict[str, float]:
    """One fresh process for one run of ``side``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    for key in [k for k in env if k.startswith(("ACCELERATE_", "MEGATRON_LM_"))]:
        del env[key]  # no launcher configuration leaks into either side
    command = [sys.executable, os.path.abspath(__file__), "--worker", side]
    for key in ("steps", "warmup", "threads", "batch", "seq"):
        command += [f"--{key}", str(getattr(args, key))]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{side} run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=5, help="runs per side, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--batch", type=int, default=16, help="samples per step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sample")
    parser.add_argument("--sides", default="accelerate,epochal,train", help="comma-separated")
    parser.add_argument("--worker", choices=tuple(SIDES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or not sides:
        parser.error(f"--sides: {unknown or 'nothing'}; choose from {', '.join(SIDES)}")
    results: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r in range(args.repeats):
        for side in sides if r % 2 == 0 else sides[::-1]:
            results[side].append(run_side(side, args))
            got = results[side][-1]
            print(
                f"# repeat {r + 1} {side}: {got['wall']:,.0f} tok/s wall, {got['cpu']:,.0f} CPU",
                flush=True,
            )
    base = sides[0]
    print(
        f"\ntorch {torch.__version__}, {args.threads} thread(s) per process, {args.repeats} "
        f"interleaved runs per side, {args.steps} timed steps of {args.batch} x {args.seq} tokens"
    )
    print(
        f"| side | tok/s wall: median (min-max) | tok/s CPU time: median (min-max) "
        f"| ratio to {base} (wall / CPU) |"
    )
    print("|---|---|---|---|")
    med = {
        s: {c: statistics.median(x[c] for x in results[s]) for c in ("wall", "cpu")} for s in sides
    }
    for side in sides:
        wall = [x["wall"] for x in results[side]]
        cpu = [x["cpu"] for x in results[side]]
        ratio = f"{med[side]['wall'] / med[base]['wall']:.3f} / {med[side]['cpu'] / med[base]['cpu']:.3f}"
        print(f"| {SIDES[side]} | {spread(wall)} | {spread(cpu)} | {ratio} |", flush=True)
    for side in sides[1:]:  # the ratio within each repeat (the runs next to each other)
        pairs = [x["cpu"] / y["cpu"] for x, y in zip(results[side], results[base])]
        print(
            f"{SIDES[side]} / {SIDES[base]}, CPU time, per repeat: "
            + ", ".join(f"{r:.3f}" for r in pairs)
            + f" (median {statistics.median(pairs):.3f})"
        )


if __name__ == "__main__":
    main()
