"""The ``epochal`` command: deterministic Megatron-style data, and GPT, BERT, ESM-2 and T5 models.

Each subcommand is a thin module of :mod:`epochal.commands` (parse the arguments,
call the library, print) that defines ``add_arguments(parser: argparse.ArgumentParser)
-> None`` and ``run(args: argparse.Namespace) -> int``. Modules are imported only when their
subcommand runs, so ``epochal --help`` is fast and needs no optional package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from epochal._fast_exit import exit_now

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "epochal.commands.train",
        "train a GPT (Llama-style), BERT, ESM-2 or T5 model from a preset or TOML config, on one "
        "process or many (torchrun); no arguments: a small CPU demo run",
    ),
    "config": (
        "epochal.commands.config",
        "write a training configuration (TOML) by answering questions, each checked with the "
        "trainer's rules, like accelerate config",
    ),
    "launch": (
        "epochal.commands.launch",
        "run a Hugging Face Accelerate script on epochal (accelerate launch's options and YAML, "
        "Megatron-LM layouts) under torchrun, on CPUs or GPUs",
    ),
    "plot": (
        "epochal.commands.plot",
        "plot a run's loss curves (train, validation, resumed segments) to PNG",
    ),
    "generate": (
        "epochal.commands.generate",
        "generate text from a GPT/Llama or T5 checkpoint (epochal, Hugging Face or Megatron-LM; "
        "greedy, sampling, beam search; tensor parallel)",
    ),
    "fill-mask": (
        "epochal.commands.fill_mask",
        "top predictions of a masked-language model (BERT / ESM-2) for each mask token",
    ),
    "embed": (
        "epochal.commands.embed",
        "protein / text embeddings and fine-tuned predictions of an encoder, in input order",
    ),
    "convert": (
        "epochal.commands.convert",
        "convert checkpoints between epochal, Hugging Face (GPT-2, Llama, BERT, ESM-2, T5) and "
        "Megatron-LM (legacy and torch_dist; NeMo 2 input), or to one .safetensors file",
    ),
    "preprocess": (
        "epochal.commands.preprocess",
        "tokenize JSONL, Parquet/Arrow or cached Hugging Face datasets into Megatron .bin/.idx "
        "indexed files",
    ),
    "merge": (
        "epochal.commands.merge",
        "merge indexed datasets (prefixes or directories) into one",
    ),
    "inspect": (
        "epochal.commands.inspect",
        "show counts, a length histogram and decoded samples of indexed files, or the samples "
        "of a step of a training run (RUN --step N)",
    ),
    "replay": (
        "epochal.commands.replay",
        "re-train a step of a run (RUN --step N) from the checkpoint before it, on one process "
        "or another layout, and say whether its loss, gradient norm and weights are identical",
    ),
    "demo-epochs": (
        "epochal.commands.demo_epochs",
        "show a small text's per-epoch shuffles and masks and check that they are reproducible",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="epochal", description=__doc__.splitlines()[0].replace("``", "")
    )
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


def run() -> None:
    """The ``epochal`` script: :func:`main`, then :func:`~epochal._fast_exit.exit_now` with its status.

    A returned status ends the process without the interpreter's teardown (about a
    second saved per process; see :mod:`epochal._fast_exit`). An exception or
    ``SystemExit`` ends it the normal way.
    """
    exit_now(main())


if __name__ == "__main__":
    run()
