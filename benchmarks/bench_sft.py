"""Fine-tuning throughput: epochal's SFT step against TRL's ``SFTTrainer``, same model, rows and batch.

Both sides fine-tune the same tiny Llama (a random ``transformers`` ``LlamaForCausalLM``
saved with the chat tokenizer shipped in ``epochal.data.sft.examples``; epochal starts
from it with ``checkpoint.init_from``) on the same conversations, one epoch, with the
loss on the assistant turns (TRL's ``assistant_only_loss``), AdamW at a constant
learning rate, gradient clipping at 1.0, the same sequence length and the same
number of samples a step, fp32 on CPU:

- ``unpacked``: one row a sample (epochal pads every sample to the sequence length;
  TRL pads each batch to its longest row);
- ``packed``: rows packed best-fit decreasing into samples of the sequence length
  (epochal: per-row attention by a mask over each sample; TRL: ``packing_strategy=
  "bfd"``, padding-free batches with per-row ``position_ids``).

The rows are made of the example conversations' turns, 1 to ``--max-turns`` pairs a
row, so their lengths spread the way chat data does. tokens/s counts the real
(non-padding) tokens of the timed steps (every step after ``--warmup``), from each
side's own batches; runs alternate (epochal, TRL, epochal, ...) and the medians are
reported, so machine noise hits both alike.

    python benchmarks/bench_sft.py
    python benchmarks/bench_sft.py --rows 320 --repeats 3 --threads 1 --clock cpu   # a busy machine
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

CLOCK = time.perf_counter


def write_rows(path: Path, rows: int, max_turns: int, seed: int) -> None:
    """``rows`` conversations of 1..max_turns user/assistant pairs from the example rows."""
    from epochal.data.sft.examples import CHAT_FILE

    pairs = []
    for line in CHAT_FILE.read_text().splitlines():
        messages = [m for m in json.loads(line)["messages"] if m["role"] != "system"]
        pairs += [messages[i : i + 2] for i in range(0, len(messages) - 1, 2)]
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            turns = min(max_turns, max(1, int(rng.lognormvariate(0.7, 0.8))))
            messages = [m for _ in range(turns) for m in rng.choice(pairs)]
            f.write(json.dumps({"messages": messages}) + "\n")


def write_model(folder: Path, args: argparse.Namespace) -> None:
    """A random Llama (seed 0) and the example chat tokenizer in a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from epochal.data.sft.examples import TOKENIZER_DIR

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.seq_length,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, folder / file.name)


def epochal_run(tmp: Path, base: Path, rows: Path, args, packing: bool) -> float:
    """epochal's Trainer for one epoch; real tokens/s over the steps after the warmup."""
    from epochal.train.config import build_config
    from epochal.train.state.encoder_init import finetune_overrides
    from epochal.train.trainer import Trainer

    init = f"--checkpoint.init_from={base}"
    overrides = [*finetune_overrides(None, [init]), init, f"--run_dir={tmp / 'epochal'}"]
    overrides += [
        f"--sft.train_file={rows}",
        f"--sft.packing={str(packing).lower()}",
        f"--data.seq_length={args.seq_length}",
        "--training.device=cpu",
        f"--training.micro_batch_size={args.batch}",
        f"--training.global_batch_size={args.batch}",
        "--training.train_iters=1",
        "--training.eval_iters=0",
        "--checkpoint.save_interval=0",
        "--optimizer.lr=1e-4",
        "--optimizer.min_lr=1e-4",
        "--optimizer.weight_decay=0",
        "--optimizer.clip_grad=1.0",
        "--scheduler.lr_decay_style=constant",
        "--logging.progress=false",
        "--logging.tensorboard=false",
    ]
    probe = Trainer(build_config(overrides=overrides), log=False)  # the samples of an epoch
    samples = len(probe.data.train_loader.dataset.dataset.dataset)
    steps = samples // args.batch
    shutil.rmtree(tmp / "epochal", ignore_errors=True)
    overrides.append(f"--training.train_iters={steps}")
    trainer = Trainer(build_config(overrides=overrides), log=False)
    train = trainer.data.train_loader.dataset
    dataset = train.dataset.dataset
    lengths = [len(e) for e in dataset.examples]
    bins = getattr(dataset, "bins", None)
    real = [sum(lengths[i] for i in b) for b in bins] if bins else lengths
    stamps: list[float] = []
    tokens: list[int] = []

    def stamp(tr, step, rec):
        stamps.append(CLOCK())
        first = (step - 1) * args.batch
        tokens.append(sum(real[train.epoch_index(g).idx] for g in range(first, first + args.batch)))

    trainer.add_callback(stamp)
    trainer.train()
    shutil.rmtree(tmp / "epochal", ignore_errors=True)
    w = args.warmup
    return sum(tokens[w:]) / (stamps[-1] - stamps[w - 1])


def trl_run(tmp: Path, base: Path, rows: Path, args, packing: bool) -> float:
    """TRL's SFTTrainer for one epoch; real tokens/s over the steps after the warmup."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation="sdpa")
    config = SFTConfig(
        output_dir=str(tmp / "trl"),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        num_train_epochs=1,
        max_length=args.seq_length,
        packing=packing,
        packing_strategy="bfd",
        assistant_only_loss=True,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,  # SFTConfig's default is bf16 autocast; both sides compute in fp32
        fp16=False,
        dataloader_num_workers=0,
        seed=1234,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=datasets.load_dataset("json", data_files=str(rows), split="train"),
        processing_class=tokenizer,
    )
    counts: list[int] = []
    collate = trainer.data_collator

    def counting(examples):
        batch = collate(examples)
        mask = batch.get("attention_mask")
        counts.append(int(mask.sum()) if mask is not None else int(batch["input_ids"].numel()))
        return batch

    trainer.data_collator = counting
    stamps: list[float] = []
    threads: list[int] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(CLOCK())
            threads.append(torch.get_num_threads())

    trainer.add_callback(Stamp())
    trainer.train()
    shutil.rmtree(tmp / "trl", ignore_errors=True)
    assert set(threads) == {torch.get_num_threads()}, threads  # the same threads as epochal's
    w = args.warmup
    return sum(counts[w : len(stamps)]) / (stamps[-1] - stamps[w - 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=480)
    parser.add_argument("--max-turns", type=int, default=6, help="user/assistant pairs a row")
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="samples a step (both sides)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per side")
    parser.add_argument("--modes", default="unpacked,packed")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = parser.parse_args()
    global CLOCK
    if args.clock == "cpu":
        CLOCK = time.process_time
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers
    import trl

    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}; {torch.get_num_threads()} CPU threads, {args.clock} clock"
    )
    print(
        f"{args.rows} chat rows (1-{args.max_turns} turns), Llama {args.layers} layers x "
        f"{args.hidden}, seq {args.seq_length}, {args.batch} samples a step, one epoch"
    )
    print("| mode | epochal tok/s | TRL SFTTrainer tok/s | epochal / TRL |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        rows, base = tmp / "rows.jsonl", tmp / "base"
        write_rows(rows, args.rows, args.max_turns, seed=0)
        write_model(base, args)
        for mode in args.modes.split(","):
            packing = mode == "packed"
            ours, theirs = [], []
            for _ in range(args.repeats):
                ours.append(epochal_run(tmp, base, rows, args, packing))
                theirs.append(trl_run(tmp, base, rows, args, packing))
            a, b = statistics.median(ours), statistics.median(theirs)
            print(f"| {mode} | {a:,.0f} | {b:,.0f} | {a / b:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
