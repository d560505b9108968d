"""The training configuration that the answers of ``epochal config`` make (no questions asked here).

*Answers* are a dict of the wizard's keys (``preset``, ``nodes``, ``tensor_parallel``,
``sequence_parallel``, ``pipeline_parallel``, ``pipeline_schedule``, ``virtual_pipeline``,
``data_parallel``, ``micro_batch_size``, ``global_batch_size``, ``selective_recompute``,
``distributed_optimizer``, ``clip_grad``, ``precision``, ``data``, ``run_dir``), any prefix of them
(the wizard checks after every answer). :func:`config_from_answers` turns them into a
checked :class:`~epochal.train.config.TrainConfig` with the trainer's own rules;
:func:`launch_commands` gives the command lines that run the written file.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from epochal._text import plural

if TYPE_CHECKING:
    from epochal.train.config import TrainConfig

__all__ = [
    "AnswerError",
    "answers_overrides",
    "answers_world_size",
    "check_answers_launchable",
    "config_from_answers",
    "launch_commands",
    "preset_value",
]


_PARALLEL_ANSWERS = (
    "tensor_parallel",
    "sequence_parallel",
    "pipeline_parallel",
    "pipeline_schedule",
    "virtual_pipeline",
)


class AnswerError(ValueError):
    """Answers that cannot make a configuration; the message says why."""


def preset_value(answers: dict[str, Any], section: str, key: str, fallback: Any) -> Any:
    """The preset's ``[section] key`` (``fallback`` when the preset does not set it)."""
    from epochal.train.config.presets import preset_dict

    return preset_dict(answers["preset"]).get(section, {}).get(key, fallback)


def answers_overrides(answers: dict[str, Any]) -> list[str]:
    """The ``--section.key=value`` overrides on the preset that the answers so far make."""
    from epochal.train.config.toml_io import _toml_value

    values: dict[str, Any] = {}
    a = answers
    for key in _PARALLEL_ANSWERS:  # answers that are [parallel] options of the same name
        if key in a:
            values[f"parallel.{key}"] = a[key]
    if "data_parallel" in a:
        values["parallel.data_parallel"] = a["data_parallel"]
        world = a["tensor_parallel"] * a["pipeline_parallel"] * a["data_parallel"]
        values["parallel.nproc_per_node"] = world // a["nodes"] if world > 1 else 0
    if "micro_batch_size" in a:
        values["training.micro_batch_size"] = a["micro_batch_size"]
    if "global_batch_size" in a:
        values["training.global_batch_size"] = a["global_batch_size"]
    elif "data_parallel" in a:  # not asked yet: check the layout with a batch that fits it
        micro = a.get("micro_batch_size") or preset_value(a, "training", "micro_batch_size", 4)
        values["training.micro_batch_size"] = micro
        values["training.global_batch_size"] = micro * a["data_parallel"]
    if a.get("selective_recompute"):
        values["parallel.recompute_granularity"] = "selective"
    if a.get("distributed_optimizer"):
        values["parallel.dp_sharding"] = "optimizer"
    if "clip_grad" in a:
        values["optimizer.clip_grad"] = a["clip_grad"]
    if "precision" in a:
        values["training.bf16"] = a["precision"] == "bf16"
        values["training.fp16"] = a["precision"] == "fp16"
    if "data" in a:
        d = a["data"]
        if d == "mock":
            values["data.mock"] = True
        elif d == "stdlib" or d.endswith((".jsonl", ".txt")):
            values["data.corpus"] = d
        else:
            values["data.data_path"] = d.replace(",", " ").split()
    if "run_dir" in a:
        values["run_dir"] = a["run_dir"]
    return [f"--{k}={_toml_value(v)}" for k, v in values.items()]


def answers_world_size(answers: dict[str, Any]) -> int:
    """Processes of the answered layout: tensor x pipeline x data parallel (1 where unanswered)."""
    return (
        answers.get("tensor_parallel", 1)
        * answers.get("pipeline_parallel", 1)
        * answers.get("data_parallel", 1)
    )


def _size_option(answers: dict[str, Any]) -> str:
    """The parallel size answered last (the one a process count beyond the machine blames)."""
    for key in ("data_parallel", "pipeline_parallel", "tensor_parallel"):
        if key in answers:
            return f"parallel.{key}"
    return "nodes"


def check_answers_launchable(answers: dict[str, Any], device_name: str = "auto") -> None:
    """Refuse more processes per node than this machine can run (the wizard's bound).

    Each node of the answered layout runs ``world / nodes`` processes; the nodes are
    assumed to be like this machine (:func:`~epochal.parallel.launch.check_launchable`:
    its CUDA devices, else its CPU cores).

    Raises:
        ConfigError: naming the parallel size answered last and both numbers.
    """
    from epochal.parallel.launch import check_launchable

    per_node = -(-answers_world_size(answers) // answers.get("nodes", 1))
    if per_node > 1:
        check_launchable(per_node, device_name, option=_size_option(answers))


def config_from_answers(answers: dict[str, Any]) -> TrainConfig:
    """Resolve the configuration of the answers so far and check it; returns the ``TrainConfig``.

    The layout is checked with :func:`~epochal.train.parallel_trainer.check_layout` (the
    model-parallel part only until ``data_parallel`` is answered), the data source once
    ``data`` is answered, and the run directory, once answered, must not hold another run
    (:func:`~epochal.train.state.run_dir.check_run_dir_holds`).

    Raises:
        AnswerError: the processes cannot be split evenly over the nodes.
        ConfigError: an option the trainer refuses (naming it).
        OSError: the data files cannot be read.
    """
    from epochal.train.config import build_config
    from epochal.train.inputs.gpt import check_data_files
    from epochal.train.parallel_trainer import check_layout

    world = answers_world_size(answers)
    if "data_parallel" in answers and world % answers["nodes"]:
        raise AnswerError(
            f"{plural(world, 'process')} (tensor {answers['tensor_parallel']} x pipeline "
            f"{answers['pipeline_parallel']} x data {answers['data_parallel']}) cannot be split "
            f"evenly over {plural(answers['nodes'], 'node')}"
        )
    config = build_config(
        preset=answers["preset"], overrides=answers_overrides(answers), require_data=False
    )
    if "data_parallel" in answers:
        check_layout(config, world)
    else:  # the data-parallel size is not known yet: check the model-parallel part
        check_layout(config, config.parallel.model_parallel_size)
    if "data" in answers:
        config.check_data()
        if config.data.has_paths:
            check_data_files(config.data)
    if "run_dir" in answers:  # a directory that holds another run would be refused by train
        from epochal.train.state.run_dir import check_run_dir_holds

        check_run_dir_holds(config)
    return config


def launch_commands(path: str, answers: dict[str, Any]) -> list[str]:
    """The command lines that run the written configuration ``path``."""
    world = answers_world_size(answers)
    nodes = answers["nodes"]
    quoted = shlex.quote(path)
    if nodes == 1:
        cmds = [f"epochal train --config {quoted}"]
        if world > 1:
            cmds.append(
                f"torchrun --standalone --nproc-per-node={world} -m epochal.cli train --config {quoted}"
            )
        return cmds
    per_node = world // nodes
    return [
        f"torchrun --nnodes={nodes} --node-rank=$NODE_RANK --nproc-per-node={per_node} "
        f"--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 "
        f"-m epochal.cli train --config {quoted}"
    ]
