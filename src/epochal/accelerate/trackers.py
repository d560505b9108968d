"""Experiment trackers of ``Accelerator(log_with=...)``: TensorBoard and Weights & Biases.

``init_trackers(project_name, config, init_kwargs)`` opens them on the main
process only (as Accelerate): TensorBoard writes to ``<logging_dir>/<project_name>``
(``logging_dir`` = ``project_dir`` unless a ``ProjectConfiguration`` names another),
with the configuration as text; W&B starts a run of project ``project_name`` with
the configuration, in ``$WANDB_MODE`` or, without credentials, offline (nothing is
sent; ``wandb sync`` uploads it later: :func:`epochal.train.observe.wandb_logger.resolve_mode`).
``log(values, step)`` writes numbers as scalars (TensorBoard: strings as text,
dicts of numbers as one chart); ``end_training()`` closes them.

``log_with``: ``"tensorboard"``, ``"wandb"``, a list of them, or ``"all"`` (every one
whose package is installed). Other trackers raise :class:`TrackerError`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SUPPORTED", "TrackerError", "Trackers", "resolve_trackers"]

SUPPORTED = ("tensorboard", "wandb")
_ACCELERATE_TRACKERS = ("comet_ml", "aim", "mlflow", "clearml", "dvclive", "swanlab", "trackio")


class TrackerError(ValueError):
    """A tracker epochal cannot open (named)."""


def _name(item: Any) -> str:
    return str(getattr(item, "value", item)).lower()


def resolve_trackers(log_with: Any) -> list[str]:
    """The tracker names of ``log_with`` (None -> none; ``"all"`` -> the installed ones).

    Raises:
        TrackerError: an unknown or unsupported tracker.
    """
    if log_with is None:
        return []
    items = (
        [log_with]
        if isinstance(log_with, str) or not isinstance(log_with, Sequence)
        else list(log_with)
    )
    names: list[str] = []
    for item in items:
        name = _name(item)
        if name == "all":
            names += [
                n
                for n in SUPPORTED
                if importlib.util.find_spec("torch.utils.tensorboard" if n == "tensorboard" else n)
            ]
        elif name in SUPPORTED:
            names.append(name)
        else:
            why = "is not supported by epochal" if name in _ACCELERATE_TRACKERS else "is unknown"
            raise TrackerError(
                f"log_with={name!r} {why}; supported: {', '.join(SUPPORTED)} or 'all'"
            )
    return list(dict.fromkeys(names))


class Trackers:
    """The open trackers of the main process (empty on the others)."""

    def __init__(self, names: list[str], logging_dir: str | None, main: bool) -> None:
        self.names = names
        self.logging_dir = logging_dir
        self.main = main
        self.opened: dict[str, Any] = {}

    def init(
        self,
        project_name: str,
        config: Mapping[str, Any] | None,
        init_kwargs: Mapping[str, Any] | None,
    ) -> None:
        """Open every tracker (main process only).

        Raises:
            TrackerError: TensorBoard without a ``project_dir`` / ``logging_dir``.
        """
        if not self.main:
            return
        kwargs = dict(init_kwargs or {})
        shown = {
            k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
            for k, v in (config or {}).items()
        }
        for name in self.names:
            extra = dict(kwargs.get(name, {}))
            if name == "tensorboard":
                if not self.logging_dir:
                    raise TrackerError(
                        "log_with='tensorboard' needs Accelerator(project_dir=...) (where the logs go)"
                    )
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(os.path.join(self.logging_dir, project_name), **extra)
                if shown:
                    writer.add_text("config", json.dumps(shown, indent=1, sort_keys=True))
                self.opened[name] = writer
            else:
                import wandb

                from epochal.train.observe.wandb_logger import resolve_mode

                extra.setdefault("mode", resolve_mode(""))
                if self.logging_dir:
                    extra.setdefault("dir", self.logging_dir)
                self.opened[name] = wandb.init(project=project_name, config=shown, **extra)

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        """Log ``values`` at ``step`` to every open tracker."""
        for name, tracker in self.opened.items():
            if name == "tensorboard":
                for key, value in values.items():
                    if isinstance(value, bool):
                        value = int(value)
                    if isinstance(value, (int, float)) or hasattr(value, "item"):
                        tracker.add_scalar(key, float(value), global_step=step)
                    elif isinstance(value, str):
                        tracker.add_text(key, value, global_step=step)
                    elif isinstance(value, Mapping):
                        tracker.add_scalars(
                            key, {k: float(v) for k, v in value.items()}, global_step=step
                        )
                tracker.flush()
            else:
                plain = {k: (v.item() if hasattr(v, "item") else v) for k, v in values.items()}
                tracker.log(plain, step=step)

    def get(self, name: str) -> Any:
        """The open tracker ``name`` (its writer / run object).

        Raises:
            TrackerError: not opened here.
        """
        if name not in self.opened:
            raise TrackerError(
                f"tracker {name!r} is not open on this process (open: {sorted(self.opened)})"
            )
        return self.opened[name]

    def finish(self) -> None:
        """Close every tracker."""
        for name, tracker in self.opened.items():
            if name == "tensorboard":
                tracker.close()
            else:
                tracker.finish()
        self.opened = {}
