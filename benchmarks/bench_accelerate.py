"""Overhead of ``epochal.accelerate``: the same tiny model through an Accelerate script vs ``epochal train``.

The model is the ``tiny`` preset's GPT (Llama-style); the Accelerate side starts
from the transformers ``LlamaForCausalLM`` that epochal's exporter makes of it, so
``accelerator.prepare`` converts it back into the very same model. Both sides
train with AdamW, the same micro-batch and global batch (two micro-batches per
step), clipping and a schedule, on in-memory random tokens:

- ``epochal train``: :class:`~epochal.train.trainer.Trainer` with its loaders
  (``make_loaders``), timed between steps by a step callback;
- ``epochal.accelerate``: a script loop (``model(**batch)``, ``accelerator.backward``,
  ``optimizer.step``, ``lr_scheduler.step``) over the prepared loader, timed between steps.

Runs alternate (trainer, accelerate, trainer, ...) and the median tokens/s of each
side is reported, so machine noise hits both alike (the target: within 5%).

    python benchmarks/bench_accelerate.py              # CPU, about 1-2 minutes
    python benchmarks/bench_accelerate.py --steps 40 --repeats 5 --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from epochal.convert.hf.io import EXPORTERS
from epochal.model import GPTModel
from epochal.train.config import build_config, model_config_from_section
from epochal.train.inputs.loaders import make_loaders
from epochal.train.trainer import Trainer

CLOCK = time.perf_counter
VOCAB = 4096


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
        if self.hf:  # transformers shifts inside the loss: seq + 1 ids give seq targets
            return {"input_ids": row[:-1], "labels": row[:-1]}
        return {"tokens": row[:-1], "labels": row[1:], "loss_mask": torch.ones(self.seq)}


def make_config(args: argparse.Namespace, run_dir: str):
    return build_config(
        preset="tiny",
        overrides=[
            f"--run_dir={run_dir}",
            "--data.corpus=",
            "--data.mock=true",
            f"--training.train_iters={args.steps + args.warmup}",
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


def trainer_loop(cfg, args: argparse.Namespace) -> float:
    """``epochal train``'s trainer; tokens/s over the steps after the warm-up."""
    n = (args.steps + args.warmup) * cfg.training.global_batch_size
    data = make_loaders(cfg, RandomTokens(n, cfg.data.seq_length, hf=False), None, vocab_size=VOCAB)
    trainer = Trainer(cfg, data=data, log=False)
    stamps: list[float] = []
    trainer.add_callback(lambda tr, step, rec: stamps.append(CLOCK()))
    trainer.train()
    tokens = cfg.training.global_batch_size * cfg.data.seq_length
    return (len(stamps) - args.warmup) * tokens / (stamps[-1] - stamps[args.warmup - 1])


def accelerate_loop(cfg, args: argparse.Namespace) -> float:
    """The same model through an Accelerate script on ``epochal.accelerate``; tokens/s."""
    import transformers

    from epochal.accelerate import Accelerator, set_seed
    from epochal.accelerate.utils import MegatronLMDummyScheduler, MegatronLMPlugin

    mc = model_config_from_section(cfg.model, vocab_size=VOCAB, seq_length=cfg.data.seq_length)
    hf_config = transformers.LlamaConfig(**EXPORTERS["llama"][0](mc))
    set_seed(cfg.training.seed)
    model = transformers.LlamaForCausalLM(hf_config)
    mbs, gbs = cfg.training.micro_batch_size, cfg.training.global_batch_size
    n = (args.steps + args.warmup) * gbs
    loader = torch.utils.data.DataLoader(
        RandomTokens(n, cfg.data.seq_length, hf=True), batch_size=mbs
    )
    o = cfg.optimizer
    named = list(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for _, p in named if p.dim() >= 2], "weight_decay": o.weight_decay},
            {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=o.lr,
        betas=(o.adam_beta1, o.adam_beta2),
        eps=o.adam_eps,
    )
    plugin = MegatronLMPlugin(
        num_micro_batches=gbs // mbs, gradient_clipping=o.clip_grad, lr_decay_style="cosine"
    )
    accelerator = Accelerator(cpu=True, megatron_lm_plugin=plugin)
    scheduler = MegatronLMDummyScheduler(
        optimizer, total_num_steps=(args.steps + args.warmup) * gbs // mbs
    )
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    stamps: list[float] = []
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        loss.item()
        stamps.append(CLOCK())
    tokens = gbs * cfg.data.seq_length
    return (len(stamps) - args.warmup) * tokens / (stamps[-1] - stamps[args.warmup - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            ours.append(trainer_loop(make_config(args, f"{tmp}/train{r}"), args))
            theirs.append(accelerate_loop(make_config(args, f"{tmp}/acc{r}"), args))
        cfg = make_config(args, tmp)
    mc = model_config_from_section(cfg.model, vocab_size=VOCAB, seq_length=cfg.data.seq_length)
    with torch.device("meta"):
        n_params = GPTModel(mc).num_parameters()
    train, acc = statistics.median(ours), statistics.median(theirs)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {args.clock} clock")
    print("| model | tokens/step | epochal train tok/s | epochal.accelerate tok/s | ratio |")
    print("|---|---|---|---|---|")
    model = f"{n_params / 1e6:.1f}M, L{mc.num_layers} h{mc.hidden_size} s{cfg.data.seq_length}"
    tokens = cfg.training.global_batch_size * cfg.data.seq_length
    print(f"| {model} | {tokens} | {train:,.0f} | {acc:,.0f} | {acc / train:.3f} |", flush=True)


if __name__ == "__main__":
    main()
