"""``epochal config --accelerate``: write Accelerate's YAML (``accelerate config``'s Megatron-LM questions).

::

    epochal config --accelerate                          # asks, writes accelerate_config.yaml
    epochal config --accelerate -o megatron_gpt.yaml --defaults
    epochal config --accelerate --defaults --tp 2 --num_processes 4 --cpu -o tp2.yaml

The questions are those ``accelerate config`` asks for ``distributed_type:
MEGATRON_LM`` (machines, the tensor / pipeline / data-parallel sizes, micro-batches,
sequence parallelism, recomputation, the distributed optimizer, clipping, mixed
precision, CPU); each answer is checked at once
(:meth:`~epochal.accelerate.yaml_config.LaunchConfig.check`, the plugin's own
rules) and asked again when invalid. The file is what ``epochal launch
--config_file`` (and ``accelerate launch``) read.

Every question has a flag (:data:`FLAGS`; ``accelerate launch``'s ``--megatron_lm_*``
spellings work too, ``--num_processes`` gives the data-parallel size as processes /
(tp x pp)); a flag answers its question, which is then not asked. With ``--defaults``
the questions without a flag take their defaults, so a script gets the file without a
prompt; the file is the one the same answers typed in would give. A flag that is
invalid, or whose question does not apply to the other answers (``--sequence_parallelism``
with tp 1, ``--machine_rank`` on one machine, ``--use_distributed_optimizer`` without data
parallelism), is refused (exit status 2) naming the flag, and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from epochal._text import plural
from epochal.commands.wizard import (
    Question,
    _Invalid,
    _positive_int,
    _yes_no,
    ask,
    layout_questions,
)

__all__ = [
    "DEFAULT_YAML",
    "FLAGS",
    "YAML_KEYS",
    "add_arguments",
    "given_flags",
    "launch_config_from",
    "questions",
    "run_accelerate",
]

DEFAULT_YAML = "accelerate_config.yaml"


def _non_negative_int(text: str) -> int:
    return _positive_int(str(int(text) + 1)) - 1 if text.strip().isdigit() else _positive_int(text)


def _several_machines(answers: dict[str, Any]) -> bool:
    return answers["nodes"] > 1


def questions() -> list[Question]:
    """The questions, in the order they are asked.

    The layout, clipping and precision questions are
    :func:`~epochal.commands.wizard.layout_questions` (``epochal config``'s too);
    :func:`launch_config_from` writes their answers under Accelerate's names (:data:`YAML_KEYS`).
    """
    layout = layout_questions()
    return [
        layout["nodes"],
        Question(
            "machine_rank",
            "This machine's rank (0 = the main one)",
            lambda a: "0",
            _non_negative_int,
            ask_if=_several_machines,
        ),
        Question(
            "main_process_ip",
            "The main machine's IP address",
            lambda a: "127.0.0.1",
            str.strip,
            ask_if=_several_machines,
        ),
        Question(
            "main_process_port",
            "The main machine's port",
            lambda a: "29500",
            _positive_int,
            ask_if=_several_machines,
        ),
        layout["tensor_parallel"],
        layout["sequence_parallel"],
        layout["pipeline_parallel"],
        layout["data_parallel"],
        Question("micro_batches", "Number of micro-batches per step", lambda a: "1", _positive_int),
        layout["selective_recompute"],
        layout["distributed_optimizer"],
        layout["clip_grad"],
        layout["precision"],
        Question("cpu", "Train on the CPU (gloo)? [yes/no]", lambda a: "no", _yes_no),
    ]


#: answer -> the key of Accelerate's ``megatron_lm_config`` it is written under
YAML_KEYS: dict[str, str] = {
    "tensor_parallel": "megatron_lm_tp_degree",
    "pipeline_parallel": "megatron_lm_pp_degree",
    "micro_batches": "megatron_lm_num_micro_batches",
    "sequence_parallel": "megatron_lm_sequence_parallelism",
    "selective_recompute": "megatron_lm_recompute_activations",
    "distributed_optimizer": "megatron_lm_use_distributed_optimizer",
    "clip_grad": "megatron_lm_gradient_clipping",
}
#: question -> its flags (the first is shown in messages; the others are aliases)
FLAGS: dict[str, tuple[str, ...]] = {
    "nodes": ("--num_machines",),
    "machine_rank": ("--machine_rank",),
    "main_process_ip": ("--main_process_ip",),
    "main_process_port": ("--main_process_port",),
    "tensor_parallel": ("--tp", "--megatron_lm_tp_degree"),
    "sequence_parallel": ("--sequence_parallelism", "--megatron_lm_sequence_parallelism"),
    "pipeline_parallel": ("--pp", "--megatron_lm_pp_degree"),
    "data_parallel": ("--dp",),
    "micro_batches": ("--num_micro_batches", "--megatron_lm_num_micro_batches"),
    "selective_recompute": ("--recompute_activations", "--megatron_lm_recompute_activations"),
    "distributed_optimizer": (
        "--use_distributed_optimizer",
        "--megatron_lm_use_distributed_optimizer",
    ),
    "clip_grad": ("--gradient_clipping", "--megatron_lm_gradient_clipping"),
    "precision": ("--mixed_precision",),
    "cpu": ("--cpu",),
}
_YES_NO = ("sequence_parallel", "selective_recompute", "distributed_optimizer", "cpu")
_METAVARS = {"main_process_ip": "IP", "clip_grad": "NORM", "precision": "{no,fp16,bf16}"}
#: when a conditional question is asked
_APPLIES = {
    "machine_rank": "--num_machines > 1",
    "main_process_ip": "--num_machines > 1",
    "main_process_port": "--num_machines > 1",
    "sequence_parallel": "--tp > 1",
    "distributed_optimizer": "a data-parallel size > 1 (--dp or --num_processes)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register one flag per question (:data:`FLAGS`) and ``--num_processes``."""
    group = parser.add_argument_group(
        "answers for --accelerate (each answers its question; with --defaults nothing is asked)"
    )
    prompts = {q.key: q.prompt for q in questions()}
    for key, flags in FLAGS.items():
        options: dict[str, Any] = {"dest": f"accelerate_{key}", "help": prompts[key]}
        if key in _YES_NO:
            options.update(nargs="?", const="yes", metavar="yes|no")
        else:
            options["metavar"] = _METAVARS.get(key, "N")
        group.add_argument(*flags, **options)
    group.add_argument(
        "--num_processes",
        dest="accelerate_num_processes",
        metavar="N",
        help="processes over all machines (gives --dp = processes / (tp x pp))",
    )


def given_flags(args: argparse.Namespace) -> dict[str, str]:
    """The answers given as flags: question key (or ``num_processes``) -> the flag's text."""
    out = {}
    for key in [*FLAGS, "num_processes"]:
        value = getattr(args, f"accelerate_{key}", None)
        if value is not None:
            out[key] = str(value)
    return out


def _flag(key: str) -> str:
    return FLAGS[key][0] if key in FLAGS else f"--{key}"


def launch_config_from(answers: dict[str, Any]):
    """The checked :class:`~epochal.accelerate.yaml_config.LaunchConfig` of the answers so far.

    Raises:
        _Invalid: the answers do not fit together (the reason).
    """
    from epochal.accelerate.yaml_config import LaunchConfig, YamlConfigError

    a = answers
    machines = a.get("nodes", 1)
    tp, pp = a.get("tensor_parallel", 1), a.get("pipeline_parallel", 1)
    # until the data-parallel size is known, a world that every later answer can still fit
    world = tp * pp * a["data_parallel"] if "data_parallel" in a else machines * tp * pp
    ip = a.get("main_process_ip") or (None if machines == 1 or "main_process_port" in a else "?")
    megatron = {name: a[key] for key, name in YAML_KEYS.items() if key in a}
    spec = LaunchConfig(
        num_processes=world,
        num_machines=machines,
        machine_rank=a.get("machine_rank", 0),
        main_process_ip=ip,
        main_process_port=a.get("main_process_port"),
        mixed_precision=a.get("precision", "no"),
        use_cpu=a.get("cpu", False),
        megatron=megatron,
    )
    try:
        spec.check("the answers")
    except YamlConfigError as exc:
        raise _Invalid(str(exc)) from None
    return spec


def _answer_from_flag(q: Question, answers: dict[str, Any], given: dict[str, str]) -> bool:
    """Answer ``q`` from its flag (True), or False when no flag gives it.

    Raises:
        _Invalid: an invalid value, or answers that do not fit together (the flag named).
    """
    text = given.get(q.key)
    if text is None and q.key == "data_parallel" and "num_processes" in given:
        world = _positive_int(given["num_processes"])
        model = answers["tensor_parallel"] * answers["pipeline_parallel"]
        if world % model:
            raise _Invalid(f"--num_processes={world} is not a multiple of tp x pp = {model}")
        text, flag = str(world // model), "--num_processes"
    elif text is None:
        return False
    else:
        flag = _flag(q.key)
    try:
        answers[q.key] = q.parse(text)
        launch_config_from(answers)
    except _Invalid as exc:
        answers.pop(q.key, None)
        raise _Invalid(f"{flag} {text}: {exc}") from None
    return True


def _collect(args: argparse.Namespace) -> dict[str, Any]:
    given = given_flags(args)
    if "data_parallel" in given and "num_processes" in given:
        raise _Invalid("give --dp or --num_processes, not both")
    answers: dict[str, Any] = {}
    for q in questions():
        if not q.ask_if(answers):
            if q.key in given:
                raise _Invalid(f"{_flag(q.key)} applies only with {_APPLIES[q.key]}")
            continue
        if _answer_from_flag(q, answers, given):
            continue
        if args.defaults:
            answers[q.key] = q.parse(q.default(answers))
        else:
            ask(q, answers, input, launch_config_from)
    return answers


def run_accelerate(args: argparse.Namespace, output: str) -> int:
    """Ask (or take the flags and defaults), write the YAML, print the launch command."""
    from epochal.accelerate.yaml_config import write_yaml

    try:
        answers = _collect(args)
    except _Invalid as exc:
        print(f"epochal config: {exc}; {output} not written", file=sys.stderr)
        return 2
    except (EOFError, KeyboardInterrupt):
        print(f"\nepochal config: stopped; {output} not written", file=sys.stderr)
        return 1
    spec = launch_config_from(answers)
    write_yaml(spec, output)
    print(
        f"epochal config: wrote {output} ({plural(spec.num_processes, 'process')} on "
        f"{plural(spec.num_machines, 'machine')})"
    )
    print(f"Launch with:\n    epochal launch --config_file {output} your_script.py ...")
    if spec.num_machines > 1:
        print(f"on every machine, with --machine_rank 0..{spec.num_machines - 1}")
    return 0
