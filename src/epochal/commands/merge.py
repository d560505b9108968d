"""``epochal merge``: concatenate several indexed datasets into one.

Inputs are prefixes or directories (every ``X.bin``/``X.idx`` pair in the directory,
sorted by name, like Megatron-LM's ``tools/merge_datasets.py --input DIR``). Documents
keep their order and boundaries. Example::

    epochal merge data/part_00_text_document data/part_01_text_document --output-prefix data/all
    epochal merge --input data/parts/ --output-prefix data/all
"""

from __future__ import annotations

import argparse
import sys

from epochal._text import plural
from epochal.data.indexed.indexed_format import IndexedFileError
from epochal.data.indexed.prefixes import expand_inputs, find_prefixes

__all__ = ["add_arguments", "expand_inputs", "find_prefixes", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``merge`` flags."""
    parser.add_argument(
        "inputs", nargs="*", metavar="PREFIX_OR_DIR", help="datasets to merge, in order"
    )
    parser.add_argument(
        "--input",
        action="extend",
        nargs="+",
        default=[],
        help="same as the positional inputs (Megatron's flag)",
    )
    parser.add_argument("--output-prefix", required=True, help="prefix of the merged .bin/.idx")
    parser.add_argument(
        "--dtype", help="token dtype of the output (default: the widest input dtype)"
    )
    parser.add_argument(
        "--multimodal", action="store_true", help="the inputs carry per-sequence modes"
    )


def _check_apart(prefixes: list[str], output_prefix: str) -> None:
    """Refuse an output ``.bin``/``.idx`` that is an input's file (or lies in an input folder),
    lies inside a run directory, checkpoint or converted model, or is a pair ``epochal
    preprocess`` wrote (it has a tokenizer record); an earlier merge's output is replaced
    (:mod:`epochal._ownership`).

    Raises:
        UnsafePathError / OwnedPathError: naming the files.
    """
    from epochal._ownership import check_writable
    from epochal._paths import check_output_apart

    for suffix in (".bin", ".idx"):
        check_writable(output_prefix + suffix, writer="merge", option="--output-prefix file")

    for prefix in prefixes:
        for suffix in (".bin", ".idx"):
            check_output_apart(
                prefix + suffix,
                output_prefix + suffix,
                source_name="the input",
                output_name="--output-prefix file",
            )


def run(args: argparse.Namespace) -> int:
    """Run ``epochal merge``; returns 0, or 1 after printing the error."""
    from epochal.data.indexed.indexed_dataset import merge_indexed_datasets

    inputs = list(args.inputs) + list(args.input)
    try:
        if not inputs:
            raise ValueError("give at least one input prefix or directory")
        prefixes = expand_inputs(inputs)
        _check_apart(prefixes, args.output_prefix)
        merged = merge_indexed_datasets(
            prefixes, args.output_prefix, dtype=args.dtype, multimodal=args.multimodal
        )
    except (IndexedFileError, FileNotFoundError, ValueError) as exc:
        print(f"epochal merge: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"merged {plural(len(prefixes), 'dataset')}: {plural(len(merged), 'sequence', fmt=',')}, "
        f"{plural(merged.document_count, 'document', fmt=',')}, "
        f"{plural(merged.num_tokens, 'token', fmt=',')} ({merged.dtype}) -> {args.output_prefix}.{{bin,idx}}"
    )
    merged.close()
    return 0
