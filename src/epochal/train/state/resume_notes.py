"""What a resume changes that the run should say: a recomputed LR schedule, a profile range passed.

The learning-rate schedule's settings come from the configuration, not the
checkpoint (Megatron's ``--override-opt_param-scheduler``), and
``scheduler.lr_decay_iters`` defaults to ``training.train_iters``. So extending a
finished run (``train_iters`` 300 -> 600) stretches the decay to the new length:
at step 301 the learning rate jumps back up (e.g. from ``min_lr`` to most of the
peak). :func:`schedule_note` says so at resume, with the learning rate before and
after, and how to keep the earlier schedule instead: ``scheduler.lr_decay_iters``
set to the earlier horizon (a ``scheduler.lr_warmup_fraction`` is a fraction of it,
so the warmup stays too), after which the rate stays at ``optimizer.min_lr``, as
Megatron's schedule does past its decay. The note names the run directory too: the
schedule is part of a run's identity, so without ``--run_dir`` the added option
would name another (new) run directory.

:func:`profile_note` says when ``logging.profile_steps`` lies wholly before the
resumed step (nothing will be profiled).
"""

from __future__ import annotations

import shlex
from types import SimpleNamespace
from typing import Any

from epochal.train.optim.lr_schedule import OptimizerParamScheduler, scheduler_from_config

__all__ = ["profile_note", "resume_notes", "schedule_note"]

#: The schedule settings a checkpoint records (``OptimizerParamScheduler.state_dict``).
_SETTINGS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style")


def _lr_at(scheduler: OptimizerParamScheduler, step: int) -> float:
    scheduler.num_steps = step
    return scheduler.get_lr()


def schedule_note(saved: dict[str, Any], config: Any) -> str | None:
    """The note for a schedule that differs from the checkpoint's, or None.

    Args:
        saved: the checkpoint's ``trainer_state.json`` (``scheduler``, ``step``).
        config: the resuming run's ``TrainConfig``.
    """
    old = saved.get("scheduler")
    if not isinstance(old, dict) or not all(k in old for k in (*_SETTINGS, "num_steps")):
        return None
    new = scheduler_from_config(SimpleNamespace(param_groups=[]), config)
    changed = [k for k in _SETTINGS if old[k] != getattr(new, k)]
    if not changed:
        return None
    previous = scheduler_from_config(SimpleNamespace(param_groups=[]), config)
    for key in _SETTINGS:
        setattr(previous, key, old[key])
    at = int(old["num_steps"])  # step k runs with the rate of k - 1 scheduler steps
    before, after = _lr_at(previous, max(at - 1, 0)), _lr_at(new, at)
    diffs = ", ".join(f"{k} {old[k]} -> {getattr(new, k)}" for k in changed)
    note = (
        f"the learning-rate schedule is recomputed for this configuration ({diffs}): the "
        f"learning rate was {before:.3g} at step {at} and is {after:.3g} at step {at + 1}"
    )
    if "lr_decay_steps" not in changed:
        return note
    return (
        f"{note}. To keep the earlier schedule instead (its decay to step "
        f"{old['lr_decay_steps']}, then optimizer.min_lr), resume with "
        f"--scheduler.lr_decay_iters={old['lr_decay_steps']} "
        f"--run_dir={shlex.quote(str(config.run_dir))}"
    )


def profile_note(config: Any, step: int) -> str | None:
    """The note for a ``logging.profile_steps`` range that ended before ``step``, or None."""
    profile = config.logging.profile_steps
    if profile is None or profile[1] > step:
        return None
    return (
        f"logging.profile_steps={profile} lies before the resumed step {step}: nothing will be "
        "profiled (name later steps to profile this segment)"
    )


def resume_notes(saved: dict[str, Any], config: Any) -> list[str]:
    """Every note of resuming from a checkpoint whose ``trainer_state.json`` is ``saved``."""
    notes = [schedule_note(saved, config), profile_note(config, int(saved.get("step", 0)))]
    return [n for n in notes if n is not None]
