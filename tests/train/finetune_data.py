"""Synthetic labelled proteins and tiny pretrained encoders for the fine-tuning tests.

Labels are learnable functions of the residues: regression = the share of
hydrophobic residues (AILMFVW), sequence class = whether that share is above 0.4,
per-residue class = ``H`` for hydrophobic residues, ``C`` otherwise.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

AMINO = "ACDEFGHIKLMNPQRSTVWY"
HYDROPHOBIC = set("AILMFVW")
TINY_ESM = [
    "--model.type=esm",
    "--model.position_embedding_type=rope",
    "--model.hidden_size=64",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=4",
    "--model.ffn_hidden_size=128",
    "--model.make_vocab_size_divisible_by=8",
    "--model.vocab_size=33",
    "--model.mask_token_id=32",
    "--model.pad_token_id=1",
    "--model.max_position_embeddings=64",
]


def proteins(n: int, seed: int, low: int = 8, high: int = 28) -> list[str]:
    """``n`` random proteins of ``low..high`` residues (a local generator)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(AMINO) for _ in range(rng.randint(low, high))) for _ in range(n)]


def label(seq: str, task: str) -> str:
    """The synthetic label of ``seq`` for ``task``."""
    share = sum(c in HYDROPHOBIC for c in seq) / len(seq)
    if task == "sequence_regression":
        return f"{share:.6f}"
    if task == "sequence_classification":
        return "high" if share > 0.4 else "low"
    return "".join("H" if c in HYDROPHOBIC else "C" for c in seq)


def write_table(path: Path, task: str, n: int, seed: int, sep: str = ",") -> Path:
    """A CSV (``sep=","``) or TSV of ``n`` labelled proteins with columns ``sequence,label``."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(["sequence", "label"])
        for s in proteins(n, seed):
            w.writerow([s, label(s, task)])
    return path


#: The tiny encoders' shared shape.
TINY_SHAPE = dict(
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=128,
    make_vocab_size_divisible_by=8,
    max_position_embeddings=64,
)


def save_random_encoder(run_dir: Path, seed: int, **fields) -> Path:
    """A model-only epochal checkpoint of a random tiny encoder of ``fields`` (the 'pretrained' run)."""
    from epochal.model import build_model
    from epochal.model.config import ModelConfig
    from epochal.train.state.epochal_ckpt import save_epochal_checkpoint

    config = ModelConfig(**TINY_SHAPE, **fields)
    model = build_model(config, seed=seed)
    save_epochal_checkpoint(config, model.state_dict(), run_dir, source="test")
    return run_dir


def pretrained_esm(run_dir: Path, seed: int = 5, **fields) -> Path:
    """A random tiny ESM-2 (ESM-2's alphabet); ``fields``: more ``[model]`` fields (a head)."""
    return save_random_encoder(
        run_dir,
        seed,
        type="esm",
        vocab_size=33,
        position_embedding_type="rope",
        mask_token_id=32,
        pad_token_id=1,
        **fields,
    )


def finetune_args(
    run_dir: Path, init: Path, train: Path, valid: Path | None, head: str, labels: int
) -> list[str]:
    """Overrides of a tiny fine-tuning run (dropout off, 4 steps)."""
    return [
        f"--run_dir={run_dir}",
        "--model.type=esm",
        "--training.device=cpu",
        f"--model.head={head}",
        f"--model.num_labels={labels}",
        "--model.hidden_dropout=0.0",
        "--model.attention_dropout=0.0",
        "--model.head_dropout=0.0",
        f"--checkpoint.init_from={init}",
        f"--finetune.train_file={train}",
        *([f"--finetune.valid_file={valid}"] if valid else []),
        "--data.seq_length=32",
        "--data.corpus=",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=8",
        "--training.train_iters=4",
        "--training.eval_interval=0",
        "--training.eval_iters=1",
        "--scheduler.lr_warmup_iters=1",
        "--optimizer.lr=0.003",
        "--checkpoint.save_interval=0",
        "--checkpoint.save_final=false",
        "--logging.progress=false",
        "--logging.tensorboard=false",
    ]


def embed(checkpoint: Path | str, source: Path | str, output: Path | str, *extra: str) -> int:
    """``epochal embed`` on the CPU without a progress bar; its return code."""
    from epochal.cli import main

    argv = [
        "embed",
        "--checkpoint",
        str(checkpoint),
        "--input",
        str(source),
        "--output",
        str(output),
    ]
    return main([*argv, "--no-progress", "--device", "cpu", *extra])


def bert_vocab(path: Path) -> Path:
    """A WordPiece vocabulary reading a protein as one word: letters and ``##`` letters."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [c.lower() for c in AMINO]
    path.write_text("\n".join([*specials, *letters, *(f"##{c}" for c in letters)]) + "\n")
    return path


def pretrained_bert(run_dir: Path, seed: int = 5) -> Path:
    """A random tiny pre-LN BERT with token types (vocabulary: :func:`bert_vocab`)."""
    return save_random_encoder(run_dir, seed, type="bert", vocab_size=47, num_tokentypes=2)
