"""``epochal config``: write a training configuration by answering questions.

In the spirit of ``accelerate config``::

    epochal config                       # asks, writes epochal.toml
    epochal config --output job.toml     # another file
    epochal config --defaults            # writes the defaults without asking
    epochal config --accelerate          # Accelerate's YAML for epochal launch instead
    epochal config -o job.toml --overwrite   # replace job.toml whoever wrote it

Each question shows its default in brackets (Enter keeps it). Every answer is
checked at once with the trainer's own rules (:func:`~epochal.train.config.build_config`
and :func:`~epochal.train.parallel_trainer.check_layout`, i.e. ``ParallelDims``):
an invalid answer (a tensor-parallel size that does not divide the attention
heads, a global batch that is not a multiple of ``micro_batch * data_parallel``)
prints the reason and the question is asked again. The file is the fully
resolved configuration (:func:`~epochal.train.config.to_toml`), written
atomically, so ``epochal train --config FILE`` runs it as is; the command to
launch it (one node or several) is printed at the end.

Precision: ``no``, ``fp16`` (Megatron's dynamic loss scaling, ``training.fp16``) or
``bf16``. The last question is the run directory (default ``runs/<file name>``, the
name ``epochal train --config FILE`` derives for the file alone); a directory that
holds another run is refused and asked again.

An existing output file is replaced only if ``epochal config`` wrote it (its first
line is :data:`~epochal._ownership.CONFIG_MARKER`), or with ``--overwrite``; anything
else (a Python script, a configuration written by hand or by ``accelerate config``) is
refused before the first question, naming the file. A file inside a run directory,
a checkpoint or a converted model is refused even with ``--overwrite``
(:mod:`epochal._ownership`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from epochal._text import plural
from epochal.commands.wizard import (
    Question,
    _choice,
    _Invalid,
    _positive_int,
    ask,
    layout_questions,
)
from epochal.train.config.answers import answers_world_size, launch_commands, preset_value

__all__ = ["Question", "add_arguments", "default_run_dir", "launch_commands", "run"]

DEFAULT_OUTPUT = "epochal.toml"


def _preset_choice(text: str) -> str:
    from epochal.train.config.presets import PRESETS

    return _choice(*PRESETS)(text)


def _data_answer(text: str) -> str:
    if not text.strip():
        raise _Invalid("give a data source")
    return text.strip()


def _default_data(answers: dict[str, Any]) -> str:
    from epochal.train.config.presets import preset_dict

    data = preset_dict(answers["preset"]).get("data", {})
    if data.get("corpus"):
        return str(data["corpus"])
    if data.get("data_path"):
        return " ".join(str(p) for p in data["data_path"])
    return "mock"


def _default_global_batch(answers: dict[str, Any]) -> str:
    """The preset's global batch, rounded up to a multiple of ``micro_batch * data_parallel``."""
    step = answers["micro_batch_size"] * answers["data_parallel"]
    preset = int(preset_value(answers, "training", "global_batch_size", 16))
    return str(-(-preset // step) * step)


def _run_dir_answer(text: str) -> str:
    if not text.strip():
        raise _Invalid("give a directory")
    return text.strip()


def default_run_dir(output: str) -> str:
    """The run directory offered for a configuration written to ``output``: ``runs/<its name>``.

    The name ``epochal train --config FILE`` would derive for the file alone
    (:mod:`epochal.train.config.run_name`).
    """
    return f"runs/{Path(output).name.removesuffix('.toml') or 'run'}"


def questions(output: str = DEFAULT_OUTPUT) -> list[Question]:
    """The wizard's questions, in the order they are asked (``output``: the file to write).

    The layout, clipping and precision questions are :func:`~epochal.commands.wizard.layout_questions`
    (their answers become the ``[parallel]`` options of the same names,
    :func:`~epochal.train.config.answers.answers_overrides`); clipping and precision default
    to the preset's.
    """
    from epochal.train.config.presets import PRESETS

    layout = layout_questions()
    return [
        Question(
            "preset",
            f"Model preset ({', '.join(PRESETS)})",
            lambda a: "tiny",
            _preset_choice,
        ),
        layout["nodes"],
        layout["tensor_parallel"],
        layout["sequence_parallel"],
        layout["pipeline_parallel"],
        Question(
            "pipeline_schedule",
            "Pipeline schedule (gpipe, 1f1b, interleaved_1f1b)",
            lambda a: "1f1b",
            _choice("gpipe", "1f1b", "interleaved_1f1b"),
            ask_if=lambda a: a["pipeline_parallel"] > 1,
        ),
        Question(
            "virtual_pipeline",
            "Model chunks per pipeline rank (virtual pipeline size)",
            lambda a: "2",
            _positive_int,
            ask_if=lambda a: a.get("pipeline_schedule") == "interleaved_1f1b",
        ),
        layout["data_parallel"],
        Question(
            "micro_batch_size",
            "Micro-batch size (samples per forward/backward)",
            lambda a: str(preset_value(a, "training", "micro_batch_size", 4)),
            _positive_int,
        ),
        Question(
            "global_batch_size",
            "Global batch size (samples per optimizer step)",
            _default_global_batch,
            _positive_int,
        ),
        layout["selective_recompute"],
        layout["distributed_optimizer"],
        dataclasses.replace(
            layout["clip_grad"],
            default=lambda a: repr(float(preset_value(a, "optimizer", "clip_grad", 1.0))),
        ),
        dataclasses.replace(
            layout["precision"],
            default=lambda a: "bf16" if preset_value(a, "training", "bf16", False) else "no",
        ),
        Question(
            "data",
            "Data: 'stdlib', a .jsonl or .txt file, Megatron prefixes (space-separated) or 'mock'",
            _default_data,
            _data_answer,
        ),
        Question(
            "run_dir",
            "Run directory (checkpoints, metrics; running the file again resumes there)",
            lambda a: default_run_dir(output),
            _run_dir_answer,
        ),
    ]


def _check(answers: dict[str, Any]):
    """The configuration of the answers so far (:func:`~epochal.train.config.answers.config_from_answers`).

    Raises:
        _Invalid: with the reason (a ``ConfigError`` names the option).
    """
    from epochal.model.config import ConfigError
    from epochal.train.config.answers import (
        AnswerError,
        check_answers_launchable,
        config_from_answers,
    )

    try:
        config = config_from_answers(answers)
        check_answers_launchable(answers, config.training.device)  # what this machine can run
        return config
    except (AnswerError, ConfigError, OSError) as exc:
        raise _Invalid(str(exc)) from None


def collect(read: Callable[[str], str] | None, output: str = DEFAULT_OUTPUT) -> dict[str, Any]:
    """Ask every question (``read=None``: take every default without asking); returns the answers.

    ``output`` is the file the answers go to (it names the default run directory).
    """
    answers: dict[str, Any] = {}
    for q in questions(output):
        if not q.ask_if(answers):
            continue  # does not apply to the answers so far (e.g. a schedule without pipeline)
        if read is None:
            answers[q.key] = q.parse(q.default(answers))
            _check(answers)  # defaults are valid; fail loudly if not
        else:
            ask(q, answers, read, _check)
    return answers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``--output`` and ``--defaults``."""
    parser.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        default=DEFAULT_OUTPUT,
        help=f"the TOML file to write (default: {DEFAULT_OUTPUT})",
    )
    parser.add_argument(
        "--defaults", action="store_true", help="write the default configuration without asking"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing output file that epochal config did not write (without it, "
        "only a file it wrote earlier is replaced)",
    )
    parser.add_argument(
        "--accelerate",
        action="store_true",
        help="write Hugging Face Accelerate's YAML (Megatron-LM layout) for epochal launch "
        "instead of a TOML training configuration (default output: accelerate_config.yaml)",
    )
    from epochal.commands.config_accelerate import add_arguments as add_accelerate_arguments

    add_accelerate_arguments(parser)


def check_output(output: str, *, overwrite: bool = False) -> str | None:
    """Why ``output`` may not be written (None: it may), checked before any question.

    An existing file is replaced only if ``epochal config`` wrote it, or with
    ``overwrite``; a folder, a file another epochal command wrote, or a path inside
    what another run or command owns, never.
    """
    from epochal._ownership import OwnedPathError, check_writable, file_writer

    path = Path(output)
    if path.is_dir():
        return f"--output {output} is a directory; name a file"
    try:
        check_writable(path, writer="config", option="--output")
    except OwnedPathError as exc:
        return str(exc)
    if path.exists() and file_writer(path) != "config" and not overwrite:
        return (
            f"--output {output} already exists and epochal config did not write it; "
            "choose another --output, or add --overwrite to replace it"
        )
    return None


def run(args: argparse.Namespace) -> int:
    """Ask, write ``args.output``, print the launch command; 0 on success, 1 on end of input."""
    from epochal._atomic import atomic_write
    from epochal._ownership import CONFIG_MARKER
    from epochal.commands.config_accelerate import FLAGS, given_flags
    from epochal.train.config import to_toml

    if not getattr(args, "accelerate", False) and given_flags(args):
        flags = ", ".join(FLAGS.get(k, (f"--{k}",))[0] for k in given_flags(args))
        print(
            f"epochal config: {flags} answer the --accelerate questions; add --accelerate",
            file=sys.stderr,
        )
        return 2
    output = args.output
    if getattr(args, "accelerate", False):
        from epochal.commands.config_accelerate import DEFAULT_YAML

        output = DEFAULT_YAML if args.output == DEFAULT_OUTPUT else args.output
    error = check_output(output, overwrite=getattr(args, "overwrite", False))
    if error:
        print(f"epochal config: error: {error}", file=sys.stderr)
        return 2
    if getattr(args, "accelerate", False):
        from epochal.commands.config_accelerate import run_accelerate

        return run_accelerate(args, output)
    if not args.defaults:
        print("epochal config: press Enter to keep the default in brackets.", flush=True)
    try:
        answers = collect(None if args.defaults else input, args.output)
    except (EOFError, KeyboardInterrupt):
        print(f"\nepochal config: stopped; {args.output} not written", file=sys.stderr)
        return 1
    except _Invalid as exc:  # --defaults: a default the machine or the disk refuses
        print(f"epochal config: error: {exc}; {args.output} not written", file=sys.stderr)
        return 2
    config = _check(answers)
    atomic_write(args.output, f"{CONFIG_MARKER}\n{to_toml(config)}")
    world = answers_world_size(answers)
    print(
        f"epochal config: wrote {args.output} ({plural(world, 'process')} on "
        f"{plural(answers['nodes'], 'node')}; run directory {answers['run_dir']})"
    )
    cmds = launch_commands(args.output, answers)
    print("Launch with:" if len(cmds) == 1 else "Launch with one of:")
    for cmd in cmds:
        print(f"    {cmd}")
    if answers["nodes"] > 1:
        print(
            "on every node, with NODE_RANK = 0..{} and MASTER_ADDR = node 0's address".format(
                answers["nodes"] - 1
            )
        )
    return 0
