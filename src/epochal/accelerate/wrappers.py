"""What ``prepare`` returns for the optimizer and the scheduler: views whose steps are no-ops.

The train step (``model(**batch)``) already zeroed the gradients, stepped the
optimizer and advanced the learning-rate schedule, as in Accelerate's Megatron-LM
backend, so ``optimizer.step()``, ``optimizer.zero_grad()`` and
``lr_scheduler.step()`` do nothing. Reading works: ``optimizer.param_groups`` (the
learning rate in use), ``optimizer.step_was_skipped`` (an fp16 overflow or a
non-finite gradient skipped the last step), ``lr_scheduler.get_last_lr()``.
Their state is saved and restored by ``accelerator.save_state`` /
``load_state``; loading it any other way raises :class:`WrapperError`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler", "WrapperError"]


class WrapperError(RuntimeError):
    """An optimizer / scheduler operation that would bypass the prepared training."""


class AcceleratedOptimizer:
    """The prepared optimizer (see the module docstring).

    Args:
        engine: the prepared model (:class:`~epochal.accelerate.engine.MegatronEngine`).
        optimizer: the user's optimizer object (kept as ``.optimizer``).
    """

    def __init__(self, engine: Any, optimizer: Any) -> None:
        self._engine = engine
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """epochal's parameter groups (their ``lr`` is the one the last step used next)."""
        return self._engine.trainer.optimizers.param_groups

    @property
    def defaults(self) -> dict[str, Any]:
        """The user's optimizer defaults."""
        return self.optimizer.defaults

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last train step skipped its update (fp16 overflow, non-finite gradients)."""
        return bool(self._engine.last_metrics.get("skipped", 0))

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: ``model(**batch)`` stepped the optimizer."""

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Nothing: ``model(**batch)`` cleared the gradients."""

    def state_dict(self) -> dict[str, Any]:
        """epochal's optimizer state (flattened, FQN-keyed; this rank's shards)."""
        return self._engine.trainer.optimizers.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused: use ``accelerator.load_state`` (it restores the whole run)."""
        raise WrapperError(
            "load the optimizer with accelerator.load_state(dir): it restores the model, "
            "optimizer, schedule, RNG and data position together"
        )

    def __repr__(self) -> str:
        return f"AcceleratedOptimizer({type(self.optimizer).__name__}, epochal)"


class AcceleratedScheduler:
    """The prepared learning-rate scheduler (see the module docstring).

    Args:
        engine: the prepared model.
        scheduler: the user's ``MegatronLMDummyScheduler`` (kept as ``.scheduler``).
    """

    def __init__(self, engine: Any, scheduler: Any) -> None:
        self._engine = engine
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: ``model(**batch)`` advanced the schedule."""

    def get_last_lr(self) -> list[float]:
        """The learning rate of every parameter group, for the next step."""
        return [float(g["lr"]) for g in self._engine.trainer.optimizers.param_groups]

    def get_lr(self) -> list[float]:
        """Same as :meth:`get_last_lr`."""
        return self.get_last_lr()

    @property
    def num_steps(self) -> int:
        """Schedule steps taken."""
        return self._engine.trainer.scheduler.num_steps

    def state_dict(self) -> dict[str, Any]:
        """The schedule's state (Megatron's keys)."""
        return self._engine.trainer.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Refused: use ``accelerator.load_state``."""
        raise WrapperError(
            "load the schedule with accelerator.load_state(dir): it restores the whole run"
        )
