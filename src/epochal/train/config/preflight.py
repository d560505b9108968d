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
  processes itself, against this machine's devices or cores);
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

__all__ = ["check_device", "preflight"]


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


def preflight(config: Any, *, relaunching: bool) -> None:
    """Run every check of the module docstring, cheapest first.

    Args:
        config: the resolved ``TrainConfig``.
        relaunching: ``epochal train`` is about to start ``torchrun`` itself
            (:func:`~epochal.parallel.launch.needs_relaunch`).

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
            option="parallel.nproc_per_node" if p.nproc_per_node else "parallel.data_parallel",
            backend=p.backend,
        )
    elif under_launcher() or wants_parallel(config):
        check_layout(config, int(os.environ.get("WORLD_SIZE", "1")))
    # after the layout: the state's memory is per process of the layout
    check_before_run(config, device_options=False)  # memory, tokenizer record
    check_run_dir_holds(config)
