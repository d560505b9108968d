"""A PyTorch learning-rate scheduler prepared with the optimizer drives the learning rate.

Any ``torch.optim.lr_scheduler`` scheduler (transformers' ``get_scheduler`` /
``get_linear_schedule_with_warmup`` / ``get_constant_schedule`` are ``LambdaLR``
ones; ``StepLR``, ``CosineAnnealingLR``, ...) given to ``accelerator.prepare``
together with its optimizer comes back as a :class:`PreparedTorchScheduler`.

Its ``step()`` is the driver, as in Accelerate's ``AcceleratedScheduler``: the
script's ``lr_scheduler.step()`` after ``model(**batch)`` steps the user's
scheduler and writes its learning rates into the prepared optimizer's groups,
which the next train step uses. So the learning rate of optimizer step ``k``
equals what plain PyTorch gives with ``optimizer.step(); lr_scheduler.step()``
each step, and nothing steps it a second time (the train step leaves the
learning rate alone: the epochal schedule is constant and follows what is
written). As in Accelerate (``split_batches=False``, the only mode epochal
has), one ``step()`` advances the schedule once per data-parallel replica
(Accelerate's ``num_processes`` under data parallelism): a schedule sized by
``len(train_dataloader)`` before ``prepare`` ends with the training, as it does
under ``accelerate launch``; with one data-parallel replica (one process, or
tensor / pipeline parallelism only) it is exactly plain PyTorch. A step that
skipped its update (fp16 overflow) does not advance it, as in Accelerate.

Its state (the user's scheduler's ``state_dict``) is saved by
``accelerator.save_state`` beside the run (``scheduler.bin``) and restored by
``load_state``, so a resumed run continues the schedule exactly.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PreparedTorchScheduler", "is_torch_scheduler"]


def is_torch_scheduler(obj: Any) -> bool:
    """A PyTorch (or PyTorch-like) learning-rate scheduler bound to an optimizer."""
    return isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
        hasattr(obj, "step") and hasattr(obj, "get_last_lr") and hasattr(obj, "optimizer")
    )


class PreparedTorchScheduler:
    """The prepared PyTorch scheduler (see the module docstring).

    Args:
        engine: the prepared model (its last step tells whether the update was skipped).
        optimizer: the prepared optimizer (:class:`~epochal.accelerate.wrappers.AcceleratedOptimizer`).
        scheduler: the user's scheduler, bound to the user's optimizer (kept as ``.scheduler``).
        steps_per_update: schedule steps per ``step()`` (the data-parallel size).
    """

    def __init__(
        self, engine: Any, optimizer: Any, scheduler: Any, steps_per_update: int = 1
    ) -> None:
        self._engine = engine
        self._optimizer = optimizer
        self.scheduler = scheduler
        self.steps_per_update = int(steps_per_update)
        self.split_batches = False
        self.step_with_optimizer = True
        self._write()

    @property
    def optimizer(self) -> Any:
        """The prepared optimizer."""
        return self._optimizer

    def _write(self) -> None:
        groups = self._optimizer.param_groups
        lrs = self.scheduler.get_last_lr()
        if len(lrs) != len(groups):
            raise ValueError(
                f"the scheduler has {len(lrs)} learning rates for {len(groups)} optimizer "
                "groups: build it on the optimizer given to prepare()"
            )
        for group, lr in zip(groups, lrs):
            group["lr"] = float(lr)

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Advance the schedule (``steps_per_update`` times) unless the last update was skipped."""
        self._engine.complete_step()  # a plain loop's step takes the rate it was computed with
        if self._engine.last_metrics.get("skipped", 0):
            return
        user_optimizer = self.scheduler.optimizer
        user_optimizer._opt_called = True  # PyTorch's "step() before optimizer.step()" check
        for _ in range(self.steps_per_update):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR stops at its end
            if total is not None and self.scheduler._step_count > total:
                break
            self.scheduler.step(*args, **kwargs)
        self._write()

    def get_last_lr(self) -> list[float]:
        """The learning rate of every parameter group, for the next step."""
        return [float(g["lr"]) for g in self._optimizer.param_groups]

    def get_lr(self) -> list[float]:
        """Same as :meth:`get_last_lr`."""
        return self.get_last_lr()

    @property
    def last_epoch(self) -> int:
        """The user's scheduler's ``last_epoch`` (schedule steps taken)."""
        return int(self.scheduler.last_epoch)

    def state_dict(self) -> dict[str, Any]:
        """The user's scheduler's state."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the user's scheduler and write its learning rates into the groups."""
        self.scheduler.load_state_dict(state_dict)
        self._write()

    def __repr__(self) -> str:
        return f"PreparedTorchScheduler({type(self.scheduler).__name__}, epochal)"
