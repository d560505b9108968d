"""``epochal config --accelerate``: write Accelerate's YAML (``accelerate config``'s Megatron-LM questions).

::

    epochal config --accelerate                          # asks, writes accelerate_config.yaml
    epochal config --accelerate -o megatron_gpt.yaml --defaults

The questions are those ``accelerate config`` asks for ``distributed_type:
MEGATRON_LM`` (machines, the tensor / pipeline / data-parallel sizes, micro-batches,
sequence parallelism, recomputation, the distributed optimizer, clipping, mixed
precision, CPU); each answer is checked at once
(:meth:`~epochal.accelerate.yaml_config.LaunchConfig.check`, the plugin's own
rules) and asked again when invalid. The file is what ``epochal launch
--config_file`` (and ``accelerate launch``) read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from epochal._text import plural
from epochal.commands.wizard import (
    Question,
    _choice,
    _Invalid,
    _non_negative_float,
    _positive_int,
    _yes_no,
)

__all__ = ["DEFAULT_YAML", "launch_config_from", "questions", "run_accelerate"]

DEFAULT_YAML = "accelerate_config.yaml"


def _non_negative_int(text: str) -> int:
    return _positive_int(str(int(text) + 1)) - 1 if text.strip().isdigit() else _positive_int(text)


def questions() -> list[Question]:
    """The questions, in the order they are asked."""
    return [
        Question("num_machines", "How many machines (nodes)", lambda a: "1", _positive_int),
        Question(
            "machine_rank",
            "This machine's rank (0 = the main one)",
            lambda a: "0",
            _non_negative_int,
            ask_if=lambda a: a["num_machines"] > 1,
        ),
        Question(
            "main_process_ip",
            "The main machine's IP address",
            lambda a: "127.0.0.1",
            str.strip,
            ask_if=lambda a: a["num_machines"] > 1,
        ),
        Question(
            "main_process_port",
            "The main machine's port",
            lambda a: "29500",
            _positive_int,
            ask_if=lambda a: a["num_machines"] > 1,
        ),
        Question("tp", "Tensor parallel degree", lambda a: "1", _positive_int),
        Question(
            "sp",
            "Sequence parallelism? [yes/no]",
            lambda a: "no",
            _yes_no,
            ask_if=lambda a: a["tp"] > 1,
        ),
        Question("pp", "Pipeline parallel degree", lambda a: "1", _positive_int),
        Question("dp", "Data parallel degree (model replicas)", lambda a: "1", _positive_int),
        Question("micro_batches", "Number of micro-batches per step", lambda a: "1", _positive_int),
        Question(
            "recompute", "Selective activation recomputation? [yes/no]", lambda a: "no", _yes_no
        ),
        Question(
            "distributed_optimizer",
            "Distributed optimizer (shard optimizer state over data-parallel ranks)? [yes/no]",
            lambda a: "no",
            _yes_no,
            ask_if=lambda a: a["dp"] > 1,
        ),
        Question(
            "clip", "Gradient clipping max norm (0 = off)", lambda a: "1.0", _non_negative_float
        ),
        Question(
            "precision",
            "Mixed precision (no, fp16, bf16)",
            lambda a: "no",
            _choice("no", "fp16", "bf16"),
        ),
        Question("cpu", "Train on the CPU (gloo)? [yes/no]", lambda a: "no", _yes_no),
    ]


def launch_config_from(answers: dict[str, Any]):
    """The checked :class:`~epochal.accelerate.yaml_config.LaunchConfig` of the answers so far.

    Raises:
        _Invalid: the answers do not fit together (the reason).
    """
    from epochal.accelerate.yaml_config import LaunchConfig, YamlConfigError

    a = answers
    machines = a.get("num_machines", 1)
    # until the data-parallel size is known, a world that every later answer can still fit
    world = a["tp"] * a["pp"] * a["dp"] if "dp" in a else machines * a.get("tp", 1) * a.get("pp", 1)
    ip = a.get("main_process_ip") or (None if machines == 1 or "main_process_port" in a else "?")
    megatron: dict[str, Any] = {}
    for key, name in (
        ("tp", "megatron_lm_tp_degree"),
        ("pp", "megatron_lm_pp_degree"),
        ("micro_batches", "megatron_lm_num_micro_batches"),
        ("sp", "megatron_lm_sequence_parallelism"),
        ("recompute", "megatron_lm_recompute_activations"),
        ("distributed_optimizer", "megatron_lm_use_distributed_optimizer"),
        ("clip", "megatron_lm_gradient_clipping"),
    ):
        if key in a:
            megatron[name] = a[key]
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


def _ask(q: Question, answers: dict[str, Any], read: Callable[[str], str]) -> None:
    default = q.default(answers)
    while True:
        text = read(f"{q.prompt} [{default}]: ").strip() or default
        try:
            answers[q.key] = q.parse(text)
            launch_config_from(answers)
            return
        except _Invalid as exc:
            answers.pop(q.key, None)
            print(f"  invalid: {exc}; please answer again", flush=True)


def run_accelerate(args: argparse.Namespace, output: str) -> int:
    """Ask (or take the defaults), write the YAML, print the launch command."""
    from epochal.accelerate.yaml_config import write_yaml

    answers: dict[str, Any] = {}
    try:
        for q in questions():
            if not q.ask_if(answers):
                continue
            if args.defaults:
                answers[q.key] = q.parse(q.default(answers))
            else:
                _ask(q, answers, input)
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
