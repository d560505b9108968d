"""Ranks of the fine-tuning layout tests: a tiny pretrained ESM fine-tuned on synthetic labels.

Module-level so that spawned gloo ranks (tests/dist_utils.run_gloo) can import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.train import finetune_data as D


def prepare(root: Path, head: str, encoder: str = "esm") -> dict[str, str]:
    """The pretrained encoder (``"esm"`` or ``"bert"``) and the train / valid tables of ``head``."""
    root.mkdir(parents=True, exist_ok=True)
    init = root / f"pretrained-{encoder}"
    files = {"encoder": encoder}
    if encoder == "bert":
        files["vocab"] = str(D.bert_vocab(root / "vocab.txt"))
    if not init.exists():
        (D.pretrained_bert if encoder == "bert" else D.pretrained_esm)(init)
    train = D.write_table(root / f"{head}-train.csv", head, 40, 1)
    # 20 rows: two global batches (8) and a half, so every layout scores a partial last batch
    valid = D.write_table(root / f"{head}-valid.tsv", head, 20, 2, sep="\t")
    return {**files, "init": str(init), "train": str(train), "valid": str(valid)}


def config(run_dir: str, files: dict[str, str], head: str, extra: list[str]) -> Any:
    from epochal.train.config import build_config
    from epochal.train.state.encoder_init import finetune_overrides

    labels = 1 if head == "sequence_regression" else 2
    args = D.finetune_args(
        Path(run_dir), Path(files["init"]), Path(files["train"]), Path(files["valid"]), head, labels
    )
    if files.get("encoder") == "bert":  # a protein read as one WordPiece word
        args = [a for a in args if a != "--model.type=esm"] + [
            "--model.type=bert",
            "--data.tokenizer_type=BertWordPieceLowerCase",
            f"--data.vocab_file={files['vocab']}",
        ]
    overrides = [*args, *extra]
    encoder = finetune_overrides(None, overrides) or []
    return build_config(preset=None, overrides=[*encoder, *overrides])


def _result(tr: Any, result: Any) -> dict[str, Any]:
    return {"losses": result.losses, "eval": result.eval_loss, "logged": tr.last_eval_logged}


def single(run_dir: str, files: dict[str, str], head: str, extra: list[str] = ()) -> dict[str, Any]:
    """The single-process Trainer's losses and evaluation values."""
    from epochal.train.trainer import Trainer

    tr = Trainer(config(run_dir, files, head, list(extra)), log=False)
    return _result(tr, tr.train())


def rank_main(
    rank: int, world_size: int, run_dir: str, files: dict[str, str], head: str, extra: list[str]
) -> dict[str, Any]:
    """One gloo rank of a ParallelTrainer run with the overrides ``extra`` (the layout)."""
    from epochal.parallel.launch import init_distributed
    from epochal.train.parallel_trainer import ParallelTrainer

    cfg = config(run_dir, files, head, extra)
    info = init_distributed(cfg.parallel, "cpu")
    tr = ParallelTrainer(cfg, log=False, dist_info=info)
    return _result(tr, tr.train())
