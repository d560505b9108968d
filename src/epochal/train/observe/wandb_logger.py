"""Weights & Biases as an optional metrics sink (``logging.wandb = true``), beside JSONL and TensorBoard.

:func:`open_wandb` starts (or, for a resumed run directory, continues) one W&B run:

- the run id is kept in ``<run_dir>/wandb_run_id`` (written once, then reused), so every
  segment of a resumed run appends to the same W&B run (``resume="allow"``);
- the mode is ``logging.wandb_mode`` if set, else ``$WANDB_MODE``, else ``"online"``
  when credentials exist (``$WANDB_API_KEY`` or an ``api.wandb.ai`` entry in
  ``~/.netrc``) and ``"offline"`` otherwise: nothing is sent without credentials, and
  ``wandb sync <dir>/wandb/offline-run-*`` uploads an offline run later;
- files go to ``logging.wandb_dir`` (default: the run directory);
- the resolved configuration is the run's W&B config.

Train records are logged every step as ``train/<name>``, evaluations as
``eval/<name>``, at the optimizer step. Only the logging rank opens a run.

Errors: ``logging.wandb`` without the ``wandb`` package installed raises
:class:`~epochal.model.config.ConfigError` naming the option and the extra to install.
"""

from __future__ import annotations

import netrc
import os
import secrets
from pathlib import Path
from typing import Any

from epochal._atomic import atomic_write
from epochal.model.config import ConfigError

__all__ = ["WANDB_MODES", "WandbSink", "open_wandb", "resolve_mode"]

WANDB_MODES = ("online", "offline", "disabled")
ID_FILE = "wandb_run_id"


def resolve_mode(configured: str) -> str:
    """The W&B mode to use (see the module docstring)."""
    if configured:
        return configured
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (OSError, netrc.NetrcParseError):
        pass
    return "offline"


class WandbSink:
    """One open W&B run: ``log(values, step)`` and ``finish()``."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, values: dict[str, Any], step: int) -> None:
        """Log numeric ``values`` (non-numbers are skipped) at ``step``."""
        numbers = {
            k: v
            for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if numbers:
            self.run.log(numbers, step=step)

    def finish(self) -> None:
        """Close the run (flushes the offline files)."""
        self.run.finish()


def open_wandb(
    run_dir: str | os.PathLike,
    *,
    project: str,
    name: str,
    directory: str,
    mode: str,
    config: dict[str, Any],
) -> WandbSink:
    """Start or continue the W&B run of ``run_dir``.

    Raises:
        ConfigError: (``logging.wandb``) the ``wandb`` package is not installed.
    """
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            "logging.wandb",
            "needs the wandb package, which is not installed: pip install 'epochal[wandb]'",
        ) from None
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    id_file = run_dir / ID_FILE
    if id_file.is_file():
        run_id = id_file.read_text().strip()
    else:
        run_id = secrets.token_hex(4)  # W&B ids: short lowercase alphanumerics
        atomic_write(id_file, run_id + "\n")
    out_dir = Path(directory) if directory else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=project,
        name=name or run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(out_dir),
        mode=resolve_mode(mode),
        config=config,
    )
    return WandbSink(run)
