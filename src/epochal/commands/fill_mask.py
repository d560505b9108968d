"""``epochal fill-mask``: the top predictions of a masked-language model for each mask token.

Examples::

    epochal fill-mask --checkpoint runs/bert-tiny --text "the cat sat on the [MASK] ."
    epochal fill-mask --checkpoint hf/bert-base-uncased --text "paris is the [MASK] of france" --top-k 3

The checkpoint is found as by ``epochal generate`` (an epochal run / checkpoint
folder of a ``bert`` / ``esm`` model, a Hugging Face folder, a Megatron-LM
checkpoint). The tokenizer is, in order: the ``--tokenizer-*`` options, the
training run's own, a Hugging Face folder's ``vocab.txt`` (WordPiece,
lower-cased unless ``--cased``) or its ``tokenizer.json``. The text is wrapped in
``[CLS] ... [SEP]``; every ``[MASK]`` (the tokenizer's mask token) gets one line.

An ESM model without a tokenizer of its own (a folder converted from Hugging Face
without ``vocab.txt``) uses ESM-2's alphabet, whose mask token is ``<mask>``.

Errors (one line on stderr, exit status 1): a missing checkpoint, a checkpoint of a
model without a masked-LM head (GPT), a tokenizer without a mask token, a text
without one, an ``--output`` that is or lies inside the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from epochal.model.generation.fill_mask import fill_mask

__all__ = ["add_arguments", "fill_mask", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of ``epochal fill-mask``."""
    parser.add_argument("--checkpoint", required=True, help="epochal run/checkpoint or HF folder")
    parser.add_argument("--format", choices=("auto", "epochal", "hf", "megatron"), default="auto")
    parser.add_argument("--vocab-size", type=int, default=None, help="unpadded vocabulary size")
    parser.add_argument(
        "--text", action="append", required=True, help="text with [MASK] (repeatable)"
    )
    parser.add_argument("--top-k", type=int, default=5, help="predictions per mask token")
    parser.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA if available"
    )
    tok = parser.add_argument_group("tokenizer (default: the checkpoint's)")
    tok.add_argument("--tokenizer-type", default=None, help="BertWordPieceLowerCase, ...")
    tok.add_argument("--tokenizer-model", default=None)
    tok.add_argument("--vocab-file", default=None)
    tok.add_argument("--merge-file", default=None)
    tok.add_argument("--cased", action="store_true", help="a HF folder's vocab.txt is cased")
    parser.add_argument("--output", default=None, help="also write the predictions as JSONL here")


def _tokenizer(args: argparse.Namespace, tokenizer: Any, model_type: str = "bert") -> Any:
    if tokenizer is not None and getattr(tokenizer, "mask", None) is not None:
        return tokenizer
    vocab = Path(args.checkpoint) / "vocab.txt"
    if vocab.is_file():
        from epochal.data.indexed.tokenizer import build_tokenizer

        kind = "BertWordPieceCase" if args.cased else "BertWordPieceLowerCase"
        kind = "ESM2Tokenizer" if model_type == "esm" else kind  # an ESM folder's vocab.txt
        return build_tokenizer(kind, vocab_file=str(vocab))
    if model_type == "esm":  # ESM-2's alphabet: what every ESM-2 checkpoint uses
        from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer

        return ESM2Tokenizer()
    if tokenizer is None:
        raise ValueError(
            f"{args.checkpoint}: no tokenizer found; give --tokenizer-type and --vocab-file"
        )
    return tokenizer


def run(args: argparse.Namespace) -> int:
    """Print the predictions of every ``--text``; 0, or 1 with a one-line error on stderr."""
    try:
        return _fill(args)
    except (OSError, ValueError) as exc:
        print(f"epochal fill-mask: error: {exc}", file=sys.stderr)
        return 1


def _fill(args: argparse.Namespace) -> int:
    """Load the model and print the predictions of every ``--text``."""
    from epochal._paths import check_output_apart
    from epochal.commands.generate import _load_model
    from epochal.model.build import model_from_state
    from epochal.train.device import resolve_device

    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.output:
        check_output_apart(
            args.checkpoint, args.output, source_name="--checkpoint", output_name="--output"
        )
    if not Path(args.checkpoint).exists():
        raise FileNotFoundError(f"--checkpoint {args.checkpoint}: no such file or folder")
    ck = _load_model(args)
    config = ck.config
    if config.type not in ("bert", "esm"):
        raise ValueError(
            f"{args.checkpoint} holds a {config.type!r} model; fill-mask needs a masked-LM (bert / esm)"
        )
    tokenizer = _tokenizer(args, ck.tokenizer, config.type)
    if getattr(tokenizer, "mask", None) is None:
        raise ValueError(f"{args.checkpoint}: the tokenizer has no mask token")
    model = model_from_state(config, ck.state).to(resolve_device(args.device)).eval()
    records = []
    for text in args.text:
        predictions = fill_mask(model, tokenizer, text, args.top_k)
        print(f"=== {text}")
        for i, preds in enumerate(predictions):
            shown = "  ".join(f"{tok} {p:.3f}" for tok, p in preds)
            print(f"[MASK] {i}: {shown}")
        records.append({"text": text, "predictions": [[list(p) for p in m] for m in predictions]})
    if args.output:
        from epochal._atomic import atomic_write

        atomic_write(args.output, "".join(json.dumps(r) + "\n" for r in records))
    return 0
