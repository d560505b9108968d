"""The ``epochal`` command.

Each subcommand lives in the module of the layer it belongs to; that module
defines ``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``. Modules are imported only when their
subcommand runs, so ``epochal --help`` is fast and needs no optional package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "epochal.commands.train",
        "train a GPT model (the main job; no arguments = a small demo run)",
    ),
    "config": (
        "epochal.commands.config",
        "write a training configuration (TOML) by answering questions, like accelerate config",
    ),
    "plot": (
        "epochal.commands.plot",
        "plot a run's loss curves (train, validation, resumed segments) to PNG",
    ),
    "generate": (
        "epochal.commands.generate",
        "generate text from a checkpoint (greedy, sampling, beam search)",
    ),
    "fill-mask": (
        "epochal.commands.fill_mask",
        "top predictions of a masked-language model (BERT / ESM) for each [MASK]",
    ),
    "embed": (
        "epochal.commands.embed",
        "protein / text embeddings and fine-tuned predictions of an encoder, in input order",
    ),
    "convert": (
        "epochal.commands.convert",
        "convert checkpoints: epochal <-> Hugging Face <-> Megatron-LM",
    ),
    "preprocess": (
        "epochal.commands.preprocess",
        "tokenize JSONL into Megatron .bin/.idx indexed files",
    ),
    "merge": ("epochal.commands.merge", "merge several indexed-file prefixes into one"),
    "inspect": (
        "epochal.commands.inspect",
        "show counts, a length histogram and decoded samples of indexed files",
    ),
    "demo-epochs": (
        "epochal.commands.demo_epochs",
        "show per-epoch shuffles and masks, reproducibly",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="epochal", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``epochal`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints help or the unknown-command error and exits
        return 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = SUBCOMMANDS[name]
    module = importlib.import_module(module_name)
    sub_parser = argparse.ArgumentParser(prog=f"epochal {name}", description=help_text)
    module.add_arguments(sub_parser)
    args = sub_parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
