"""``epochal launch``: run an Accelerate script on epochal, the way ``accelerate launch`` does.

::

    epochal launch --config_file megatron_gpt_config.yaml script.py --script-args ...
    epochal launch --num_processes 2 --megatron_lm_tp_degree 2 --cpu script.py ...
    epochal launch script.py ...            # one process

The YAML file is Accelerate's (what ``accelerate config`` or ``epochal config
--accelerate`` writes: ``distributed_type: MEGATRON_LM``, ``megatron_lm_config``,
``num_processes``, ``num_machines``, ...; :mod:`epochal.accelerate.yaml_config`).
Options on the command line win over the file. The script gets the environment
``accelerate launch`` would give it (``MEGATRON_LM_*``, ``ACCELERATE_MIXED_PRECISION``,
``ACCELERATE_USE_CPU``), which ``epochal.accelerate.Accelerator`` reads, and runs
under ``torchrun`` (``--standalone`` on one machine; ``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port`` on several: run the same command on every
machine with its ``--machine_rank``). One process runs as ``python script.py``.
Exit status: the script's (torchrun's).

The processes per machine are bounded before any starts, as ``epochal train`` bounds
the processes it launches (:func:`epochal.parallel.launch.local_process_limit`): on
GPUs, one per visible GPU (``gpu_ids`` / ``CUDA_VISIBLE_DEVICES``; each process drives
its own); on the CPU, :data:`PROCESSES_PER_CPU` per CPU core this process may use. More
is refused (exit status 2) naming the option and the bound; ``--oversubscribe`` (Open
MPI's name for the same choice, a flag of ``epochal train`` too) starts more CPU
processes anyway, e.g. to test a layout on a small machine. Accelerate itself starts
whatever it is given.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from epochal.parallel.process_limit import PROCESSES_PER_CPU, cpu_process_limit, usable_cpu_cores

__all__ = ["PROCESSES_PER_CPU", "add_arguments", "process_bound", "run"]

_MEGATRON_FLAGS = {
    "megatron_lm_tp_degree": int,
    "megatron_lm_pp_degree": int,
    "megatron_lm_num_micro_batches": int,
    "megatron_lm_sequence_parallelism": str,
    "megatron_lm_recompute_activations": str,
    "megatron_lm_use_distributed_optimizer": str,
    "megatron_lm_gradient_clipping": float,
    "megatron_lm_context_parallel_size": int,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register Accelerate's launch options, the script and its arguments."""
    parser.add_argument(
        "--config_file", metavar="FILE.yaml", help="Accelerate's YAML configuration"
    )
    parser.add_argument("--num_processes", type=int, help="processes over all machines")
    parser.add_argument("--num_machines", type=int, help="machines (nodes)")
    parser.add_argument("--machine_rank", type=int, help="this machine's rank (0 = main)")
    parser.add_argument("--main_process_ip", help="the main machine's address (several machines)")
    parser.add_argument("--main_process_port", type=int, help="the main machine's port")
    parser.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"))
    parser.add_argument("--cpu", action="store_true", help="train on the CPU (gloo) even with GPUs")
    parser.add_argument(
        "--use_megatron_lm",
        action="store_true",
        help="give the script's Accelerator a Megatron-LM plugin (as distributed_type: "
        "MEGATRON_LM or any --megatron_lm_* flag does): its train step clips at "
        "megatron_lm_gradient_clipping (default 1.0); without one the script clips only "
        "through clip_grad_norm_",
    )
    parser.add_argument(
        "--oversubscribe",
        action="store_true",
        help=f"start more CPU processes per machine than {PROCESSES_PER_CPU} per CPU core",
    )
    for flag, kind in _MEGATRON_FLAGS.items():
        metavar = "{true,false}" if kind is str else kind.__name__.upper()
        parser.add_argument(f"--{flag}", type=kind, metavar=metavar, help="overrides the YAML's")
    parser.add_argument("script", help="the training script (a .py file)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments")


def _bool(text: str, flag: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"--{flag} must be true or false, got {text!r}")


def launch_config(args: argparse.Namespace):
    """The :class:`~epochal.accelerate.yaml_config.LaunchConfig` of the file and the flags."""
    from epochal.accelerate.yaml_config import LaunchConfig, read_launch_config

    spec = read_launch_config(args.config_file) if args.config_file else LaunchConfig()
    for key in (
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "mixed_precision",
    ):
        if getattr(args, key) is not None:
            setattr(spec, key, getattr(args, key))
    if args.cpu:
        spec.use_cpu = True
    if args.use_megatron_lm:
        spec.use_megatron_lm = True
    for flag, kind in _MEGATRON_FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            spec.megatron[flag] = _bool(value, flag) if kind is str else value
    spec.check(
        "the command line" if not args.config_file else f"{args.config_file} with the command line"
    )
    return spec


_cpu_count = usable_cpu_cores


def process_bound(spec, oversubscribe: bool = False) -> tuple[int, str] | None:
    """The most processes this machine runs for ``spec`` and why, or None (no bound).

    On GPUs the visible GPUs (``spec.gpu_ids`` when set); on the CPU (``use_cpu`` or
    no CUDA device) :data:`PROCESSES_PER_CPU` per usable core, None with ``oversubscribe``.
    """
    import torch

    if not spec.use_cpu and torch.cuda.is_available():
        ids = str(spec.gpu_ids or "all")
        count = torch.cuda.device_count() if ids == "all" else len([i for i in ids.split(",") if i])
        return count, f"one process per GPU, {count} visible"
    limit, why = cpu_process_limit(oversubscribe)
    return None if limit is None else (limit, f"{why}; --oversubscribe starts them anyway")


def run(args: argparse.Namespace) -> int:
    """Launch the script (see the module docstring)."""
    from epochal.accelerate.yaml_config import YamlConfigError
    from epochal.parallel.config import ParallelConfig
    from epochal.parallel.launch import relaunch

    if not os.path.isfile(args.script):
        print(f"epochal launch: {args.script}: no such file", file=sys.stderr)
        return 2
    try:
        spec = launch_config(args)
    except (YamlConfigError, ValueError, FileNotFoundError) as exc:
        print(f"epochal launch: {exc}", file=sys.stderr)
        return 2
    bound = process_bound(spec, args.oversubscribe)
    if bound is not None and spec.nproc_per_node > bound[0]:
        option = (
            "--num_processes"
            if args.num_processes is not None
            else f"num_processes in {args.config_file}"
        )
        per_node = "" if spec.num_machines == 1 else f" ({spec.nproc_per_node} per machine)"
        print(
            f"epochal launch: {option}={spec.num_processes}{per_node} is more processes than "
            f"this machine runs: at most {bound[0]} ({bound[1]}); lower it",
            file=sys.stderr,
        )
        return 2
    os.environ.update(spec.environment())
    script_args = list(args.script_args)
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    if spec.num_processes == 1:
        return subprocess.call([sys.executable, args.script, *script_args])
    if spec.num_machines > 1:
        rendezvous = [
            f"--nnodes={spec.num_machines}",
            f"--node-rank={spec.machine_rank}",
            f"--master-addr={spec.main_process_ip}",
            f"--master-port={spec.main_process_port or 29500}",
        ]
        if spec.rdzv_backend != "static":
            rendezvous.append(f"--rdzv-backend={spec.rdzv_backend}")
    else:
        rendezvous = ["--standalone"]
    return relaunch(
        ParallelConfig(nproc_per_node=spec.nproc_per_node),
        script_args,
        script=args.script,
        rendezvous=rendezvous,
    )
