"""The default run directory: a name that says which run it holds.

A configuration that does not set ``run_dir`` (in its TOML file or with
``--run_dir``) trains in ``runs/<name>``:

- ``<name>`` is ``<base>`` when the options that define the run are the base's,
  and ``<base>-<8 hex digits>`` otherwise: a hash of the run-defining options
  whose values differ from the base's (name and value, sorted).
- ``<base>`` is the config file's name without ``.toml`` (``--config job.toml``:
  ``job``), else the preset (``tiny`` when ``epochal train`` gets neither), else
  the model type (and head of a fine-tune: ``esm-sequence_regression``).
- The base's options are the preset's (none: the built-in defaults); for a config
  file, the preset's options merged with the file's, so the file alone gives
  ``runs/<file name>`` and command-line overrides add the hash.

Run-defining means every option except those of :data:`NOT_RUN_DEFINING`: how
long it trains (``training.train_iters``, the ``exit_*`` options), evaluation,
checkpointing (except ``checkpoint.init_from``), logging, the device, the speed
levers that give the same results (compile, fused AdamW, attention kernels, loss
chunks), the checks that only refuse or allow a start (``training.memory_check``)
or pin GPU kernels to one of the results they may give (``training.deterministic_kernels``:
nothing changes on the CPU), data-loader workers and cache, and the launcher's settings. So the same
command resumes its run, a larger ``--training.train_iters`` continues it, and a
command that changes the model, data, seed, batch sizes, optimizer, schedule,
precision, parallel layout or fine-tuning table trains in a directory of its own.

The number of processes ``torchrun`` starts is not part of the name: a job
resumed on more or fewer nodes continues its run (checkpoints reshard).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["NOT_RUN_DEFINING", "default_run_dir", "defines_run", "flat_options", "run_name"]

#: The options that do not change which run a configuration is (section -> names).
NOT_RUN_DEFINING: dict[str, frozenset[str]] = {
    "": frozenset({"run_dir"}),
    "training": frozenset(
        {
            "train_iters",
            "eval_interval",
            "eval_iters",
            "eval_callback",
            "device",
            "compile",
            "compile_loss",
            "loss_chunk_tokens",
            "fused_adamw",
            "attention_backend",
            "exit_signal_handler",
            "exit_duration_mins",
            "exit_interval",
            "memory_check",
            "deterministic_kernels",
        }
    ),
    "checkpoint": frozenset({"save_interval", "save_final", "keep_last", "resume"}),
    "logging": frozenset(
        {
            "log_interval",
            "progress",
            "tensorboard",
            "wandb",
            "wandb_project",
            "wandb_name",
            "wandb_dir",
            "wandb_mode",
            "peak_tflops",
            "profile_steps",
        }
    ),
    "data": frozenset(
        {"num_workers", "cache_dir", "blend_schedule", "blend_schedule_interpolation"}
    ),
    "parallel": frozenset({"nproc_per_node", "backend", "timeout_minutes"}),
}

#: The directory default names live in.
RUNS_ROOT = "runs"


def flat_options(config: Any) -> dict[str, Any]:
    """``{"section.key": value}`` (top-level options undotted) of a configuration tree."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            for g in dataclasses.fields(value):
                out[f"{f.name}.{g.name}"] = getattr(value, g.name)
        else:
            out[f.name] = value
    return out


def defines_run(option: str) -> bool:
    """Whether the dotted ``option`` is part of a run's identity (see the module docstring)."""
    section, _, key = option.rpartition(".")
    return key not in NOT_RUN_DEFINING.get(section, frozenset())


def _digest(options: dict[str, Any]) -> str:
    text = json.dumps(sorted(options.items()), default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def run_name(base_name: str, config: Any, base: Any | None) -> str:
    """``base_name``, or ``base_name-<hash>`` when ``config``'s run-defining options differ from ``base``'s.

    Args:
        base_name: the name of what the configuration starts from (file, preset, model).
        config: the resolved configuration (a ``TrainConfig``).
        base: the configuration ``base_name`` stands for; None: always add the hash
            (of every run-defining option).
    """
    ours = {k: v for k, v in flat_options(config).items() if defines_run(k)}
    if base is not None:
        theirs = flat_options(base)
        ours = {k: v for k, v in ours.items() if theirs.get(k, object()) != v}
        if not ours:
            return base_name
    return f"{base_name}-{_digest(ours)}"


def default_run_dir(
    config: Any, *, preset: str | None, config_file: str | Path | None, base: Any | None
) -> str:
    """``runs/<name>`` for a configuration that sets no ``run_dir`` (see the module docstring).

    Args:
        config: the resolved configuration.
        preset: the preset it starts from, or None.
        config_file: the TOML file it was read from, or None.
        base: the configuration of the preset (merged with the file's options), or
            None when it cannot be resolved on its own.
    """
    if config_file is not None:
        base_name = Path(config_file).name.removesuffix(".toml") or "run"
    elif preset is not None:
        base_name = preset
    else:
        m = config.model
        base_name = m.type if m.head == "mlm" else f"{m.type}-{m.head}"
    return f"{RUNS_ROOT}/{run_name(base_name, config, base)}"
