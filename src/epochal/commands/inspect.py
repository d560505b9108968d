"""``epochal inspect PREFIX``: counts, a length histogram and decoded samples of indexed files;
``epochal inspect RUN --step N``: the samples step N of a training run read.

Opening validates the pair, so ``inspect`` is also a quick integrity check. Samples
are decoded with the tokenizer given (same flags as ``preprocess``), else with the one
``epochal preprocess`` recorded beside the files (``PREFIX.tokenizer.json``, when it still
gives the recorded ids), else shown as ids.
A run directory (it holds the ``config.toml`` a run saves) is inspected by step: the
step's global samples, rebuilt from the run's configuration and data
(:mod:`epochal.train.inputs.run_samples`), and their digest, which equals the step's
``sample_digest`` in ``metrics.jsonl`` when the data is unchanged. ``--sources`` prints
the ledger of a blended run's newest checkpoint: per source, the samples it served,
the epoch it is in and where its next sample starts. Examples::

    epochal inspect data/corpus_text_document --tokenizer-type gpt2 --samples 3
    epochal inspect runs/tiny --step 20
    epochal inspect runs/tiny --sources
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from epochal._text import plural
from epochal.commands.preprocess import add_tokenizer_arguments, tokenizer_from_args
from epochal.data.indexed.indexed_dataset import IndexedDataset
from epochal.data.indexed.indexed_format import IndexedFileError
from epochal.data.indexed.summary import length_statistics, sample_indices, summarize_indexed
from epochal.data.indexed.tokenizer import TokenizerFileError, build_tokenizer
from epochal.data.indexed.tokenizer_record import (
    OPTIONS,
    read_tokenizer_record,
    record_path,
    tokenizer_fingerprint,
)

__all__ = ["add_arguments", "length_statistics", "run", "sample_indices"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``inspect`` flags."""
    parser.add_argument(
        "prefix",
        metavar="PATH",
        help="dataset prefix (PREFIX.bin and PREFIX.idx), or a run directory (with --step)",
    )
    parser.add_argument(
        "--step",
        type=int,
        default=None,
        help="of a run directory: list the samples of this optimizer step (1-based) and their digest",
    )
    parser.add_argument(
        "--sources",
        action="store_true",
        help="of a run directory with a blend: per source, the samples consumed, its epoch and "
        "where its next sample starts (at the newest checkpoint)",
    )
    parser.add_argument(
        "--samples", type=int, default=3, help="sequences to show, evenly spaced (default 3)"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=64, help="tokens shown per sample (default 64)"
    )
    parser.add_argument(
        "--mode", choices=["mmap", "cached", "lazy"], default="mmap", help="read mode"
    )
    parser.add_argument(
        "--multimodal", action="store_true", help="the index carries per-sequence modes"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the statistics as one JSON object"
    )
    add_tokenizer_arguments(parser, required=False)


def run(args: argparse.Namespace) -> int:
    """Run ``epochal inspect``; returns 0, or 1 after printing the error."""
    if args.sources:
        from epochal.commands.inspect_run import run_sources

        return run_sources(args)
    if args.step is not None or (Path(args.prefix) / "config.toml").is_file():  # a run directory
        from epochal.commands.inspect_run import run_step

        return run_step(args)
    try:
        tokenizer = tokenizer_from_args(args) if args.tokenizer_type else None
        dataset = IndexedDataset(args.prefix, mode=args.mode, multimodal=args.multimodal)
    except (IndexedFileError, TokenizerFileError, FileNotFoundError, ValueError) as exc:
        print(f"epochal inspect: error: {exc}", file=sys.stderr)
        return 1
    with dataset:
        decoded_with = args.tokenizer_type or None
        if tokenizer is None:
            try:
                tokenizer, decoded_with = _recorded_tokenizer(dataset.path_prefix)
            except ValueError as exc:  # a malformed record: named, with what to do
                print(f"epochal inspect: error: {exc}", file=sys.stderr)
                return 1
        info = summarize_indexed(
            dataset, samples=args.samples, max_tokens=args.max_tokens, tokenizer=tokenizer
        )
    info["decoded_with"] = decoded_with
    if args.json:
        print(json.dumps(info))
        return 0
    _print_report(info, args.max_tokens)
    return 0


def _recorded_tokenizer(prefix: str) -> tuple[Any, str | None]:
    """The tokenizer recorded beside ``prefix`` and its description, or ``(None, None)``.

    A recorded tokenizer that cannot be built any more (a file moved) or that gives
    other ids than it recorded (its files changed) is not used: a note on stderr
    says so, and the samples are shown as ids.

    Raises:
        TokenizerRecordError: the record exists but cannot be read (names the file).
    """
    record = read_tokenizer_record(prefix)
    if record is None:
        return None, None
    path, kind = record_path(prefix), record["tokenizer_type"]
    options = {k: record[k] for k in OPTIONS if record.get(k) is not None}
    why = None
    try:
        tokenizer = build_tokenizer(kind, **options)
        if tokenizer_fingerprint(tokenizer) != record["fingerprint"]:
            why = "it gives other ids than it recorded (its files changed)"
    except (TokenizerFileError, OSError, ValueError) as exc:
        why = f"it cannot be built ({exc})"
    if why is not None:
        print(
            f"epochal inspect: note: showing ids: {path} names {kind}, but {why}; pass "
            "--tokenizer-type (and its files) to decode",
            file=sys.stderr,
        )
        return None, None
    return tokenizer, f"{kind} (recorded in {path})"


def _print_report(info: dict[str, Any], max_tokens: int) -> None:
    print(
        f"{info['prefix']}: {plural(info['sequences'], 'sequence', fmt=',')} in "
        f"{plural(info['documents'], 'document', fmt=',')}, {plural(info['tokens'], 'token', fmt=',')} "
        f"({info['dtype']}); .bin {info['bin_bytes']:,} bytes, .idx {info['idx_bytes']:,} bytes"
    )
    if info["empty_documents"]:
        print(f"documents without sequences: {info['empty_documents']:,}")
    stats = info["lengths"]
    if stats["min"] is None:
        return
    print(
        f"sequence length (tokens): min {stats['min']:,}, mean {stats['mean']:,.1f}, median {stats['median']:,.0f}, "
        f"p99 {stats['p99']:,.0f}, max {stats['max']:,}"
    )
    peak = max(count for _, _, count in stats["histogram"])
    width = len(f"{stats['histogram'][-1][1]:,}")
    for low, high, count in stats["histogram"]:
        bar = "#" * (round(40 * count / peak) if peak else 0)
        print(f"  [{low:>{width},}, {high:>{width},})  {bar:<40} {count:,}")
    if info["samples"] and info.get("decoded_with"):
        print(f"decoded with {info['decoded_with']}:")
    for sample in info["samples"]:
        cut = "..." if sample["length"] > max_tokens else ""
        shown = (
            repr(sample["text"])
            if sample["text"] is not None
            else " ".join(map(str, sample["ids"]))
        )
        print(
            f"sequence {sample['index']:,} ({plural(sample['length'], 'token', fmt=',')}): {shown}{cut}"
        )
