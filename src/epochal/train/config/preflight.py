"""What ``epochal train`` checks before any data is built, any process launched or any tensor allocated.

:func:`preflight` is the one place for these checks; each raises
:class:`~epochal.model.config.ConfigError` naming the option and what to do:

- the device: ``training.device = "cuda"`` needs a CUDA device (:func:`check_device`);
- sizes: sequence lengths against the model's positions and attention memory
  against the device's (:func:`~epochal.train.config.limits.check_sizes`);
- the data files named by ``data.data_path`` (and the per-split paths) exist and are
  readable;
- the process-group backend and the attention kernel
  (:func:`~epochal.train.run_checks.check_device_options`);
- the parallel layout against the options (and, when ``epochal train`` launches the
  processes itself, against this machine's bound: one per GPU, or 4 per CPU core
  unless ``--oversubscribe``, :func:`~epochal.parallel.launch.local_process_limit`);
- the training state's memory (per process of the layout) and an explicit tokenizer
  against the data's record (:func:`~epochal.train.run_checks.check_before_run`);
- the run directory holds no other run
  (:func:`~epochal.train.state.run_dir.check_run_dir_holds`).

Under ``torchrun`` every rank runs them (and all refuse alike); ``epochal train``
prints the error on rank 0 only. Launching ``torchrun`` itself, it runs them once,
before the launch.
"""

from __future__ import annotations

import os
from typing import Any

from epochal.model.config import ConfigError

__all__ = ["check_device", "launch_option", "preflight", "training_notes"]


def check_device(config: Any) -> None:
    """Refuse ``training.device = "cuda"`` on a machine without a usable CUDA device.

    Raises:
        ConfigError: (``training.device``) naming PyTorch's build and the alternatives.
    """
    if config.training.device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU only"
        raise ConfigError(
            "training.device",
            f"is 'cuda' but no CUDA device is available (PyTorch {torch.__version__}, "
            f"{build}); use --training.device=cpu, or auto to take a GPU when there is one",
        )


def preflight(config: Any, *, relaunching: bool, oversubscribe: bool = False) -> None:
    """Run every check of the module docstring, cheapest first.

    Args:
        config: the resolved ``TrainConfig``.
        relaunching: ``epochal train`` is about to start ``torchrun`` itself
            (:func:`~epochal.parallel.launch.needs_relaunch`).
        oversubscribe: start more CPU processes than the machine's bound
            (:mod:`epochal.parallel.process_limit`; ``epochal train --oversubscribe``).

    Raises:
        ConfigError: the first check that fails (naming the option).
    """
    from epochal.parallel.launch import under_launcher
    from epochal.train.config.limits import check_sizes
    from epochal.train.device import resolve_device
    from epochal.train.inputs.gpt import check_data_files
    from epochal.train.parallel_trainer import check_layout, wants_parallel
    from epochal.train.run_checks import check_before_run, check_device_options
    from epochal.train.state.run_dir import check_run_dir_holds

    check_device(config)
    check_sizes(config)
    if not (config.data.corpus or config.data.mock):
        check_data_files(config.data)
    check_device_options(config, resolve_device(config.training.device))  # backend, kernels
    if relaunching:
        from epochal.parallel.launch import check_launchable

        p = config.parallel
        check_layout(config, p.launch_world_size())  # what the options mean, then the machine
        check_launchable(
            p.launch_world_size(),
            config.training.device,
            option=launch_option(p),
            backend=p.backend,
            oversubscribe=oversubscribe,
        )
    elif under_launcher() or wants_parallel(config):
        check_layout(config, int(os.environ.get("WORLD_SIZE", "1")))
    # after the layout: the state's memory is per process of the layout
    check_before_run(config, device_options=False)  # memory, tokenizer record
    check_run_dir_holds(config)


def launch_option(parallel: Any) -> str:
    """The option a self-launched process count is blamed on (a ``ParallelConfig``'s).

    ``parallel.nproc_per_node`` when set, else ``parallel.data_parallel`` when set, else
    the largest of the tensor-, context-, pipeline- and expert-parallel sizes.
    """
    if parallel.nproc_per_node:
        return "parallel.nproc_per_node"
    if parallel.data_parallel is not None:
        return "parallel.data_parallel"
    sizes = ("tensor_parallel", "context_parallel", "pipeline_parallel", "expert_parallel")
    return "parallel." + max(sizes, key=lambda name: getattr(parallel, name))


def training_notes(config: Any, *, oversubscribe: bool = False) -> list[str]:
    """What training ``config`` would need, one sentence each (``epochal train --print-config``).

    Nothing is raised and nothing is started or prepared. The notes, in this order:

    - no data source, or each ``.bin`` / ``.idx`` file the data paths name that is missing;
    - ``training.device = "cuda"`` without a CUDA device;
    - the processes the parallel layout runs and how they start (``epochal train``
      launching them on this machine, or ``torchrun``), when more than one;
    - a layout that does not fit the model or the batch sizes on those processes;
    - more processes than this machine starts
      (:func:`~epochal.parallel.launch.check_launchable`; ``--oversubscribe``).

    Args:
        config: the resolved ``TrainConfig``.
        oversubscribe: as ``epochal train --oversubscribe`` (no CPU process bound).

    Returns:
        The notes (empty when none of these stands in the way).
    """
    from epochal._text import plural
    from epochal.parallel.launch import check_launchable
    from epochal.train.inputs.gpt import missing_data_files
    from epochal.train.parallel_trainer import check_layout, wants_parallel

    notes = []
    try:
        config.check_data()
        if not (config.data.corpus or config.data.mock):
            missing: dict[tuple[str, str], list[str]] = {}
            for option, prefix, path in missing_data_files(config.data):
                missing.setdefault((option, prefix), []).append(path.name)
            for (option, prefix), names in missing.items():
                files = " and ".join(names)
                notes.append(
                    f"to train, {option}: prefix {prefix!r} has no {files} (epochal preprocess "
                    "writes both)"
                )
    except ConfigError as exc:
        notes.append(f"to train, {exc}")
    try:
        check_device(config)
    except ConfigError as exc:
        notes.append(f"to train, {exc}")
    p = config.parallel
    processes = p.launch_world_size()
    if processes == 1 and not wants_parallel(config):
        return notes
    notes.append(_processes_note(p, processes))
    try:
        check_layout(config, processes)
    except ConfigError as exc:
        notes.append(f"to train on {plural(processes, 'process')}, {exc}")
        return notes
    try:
        check_launchable(
            processes,
            config.training.device,
            option=launch_option(p),
            backend=p.backend,
            oversubscribe=oversubscribe,
        )
    except ConfigError as exc:
        notes.append(f"to start them on this machine, {exc}")
    return notes


def _processes_note(parallel: Any, processes: int) -> str:
    """``"the layout TP2 x DP2 runs 4 processes: ..."``: how many and how they start."""
    from epochal._text import plural

    if parallel.nproc_per_node:
        return (
            f"parallel.nproc_per_node: epochal train starts {plural(processes, 'process')} on "
            f"this machine; under torchrun it is ignored (--nproc-per-node={processes} there)"
        )
    head = f"the layout {parallel.describe_launch()} runs {plural(processes, 'process')}"
    if parallel.data_parallel is not None:
        return (
            f"{head}: epochal train starts them on this machine, or torchrun on "
            f"--nnodes x --nproc-per-node = {processes}"
        )
    return (
        f"{head}: epochal train starts them on this machine; under torchrun any multiple of "
        f"{processes} works, the data-parallel size being the world size / "
        f"{parallel.model_parallel_size}"
    )
