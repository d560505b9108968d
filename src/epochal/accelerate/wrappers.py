"""What ``prepare`` returns for the optimizer and the scheduler: views whose steps are no-ops.

The train step (``model(**batch)``) already zeroed the gradients, stepped the
optimizer and advanced the learning-rate schedule, as in Accelerate's Megatron-LM
backend, so ``optimizer.step()``, ``optimizer.zero_grad()`` and the ``step()`` of a
prepared ``MegatronLMDummyScheduler`` do nothing (a plain loop without a Megatron-LM
plugin is the exception: its ``optimizer.step()`` applies the step's update, see
:mod:`epochal.accelerate.engine`). (A ``torch.optim.lr_scheduler``
scheduler is the exception: its ``step()`` drives the learning rate, see
:mod:`epochal.accelerate.schedulers`.) Reading works: ``optimizer.param_groups`` (the
learning rate in use), ``optimizer.step_was_skipped`` (an fp16 overflow or a
non-finite gradient skipped the last step), ``lr_scheduler.get_last_lr()``.
Their state is saved and restored by ``accelerator.save_state`` /
``load_state``; loading it any other way raises :class:`WrapperError`.

``optimizer.param_groups[i]`` is the user's group ``i`` (over epochal's parameters
of every model part). Writing an option there works as in PyTorch: the next step
uses it. A learning rate or weight decay that nothing schedules sticks (e.g. a
step decay ``g["lr"] *= 0.1`` at an epoch boundary, saved and restored with the
run); where a schedule drives the value -- a ``MegatronLMDummyScheduler``
prepared with the optimizer for the learning rate, a
``weight_decay_incr_style`` other than constant for the weight decay -- the
schedule writes its own value after the next step, as a PyTorch scheduler does
at its ``step()``.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

__all__ = ["AcceleratedOptimizer", "AcceleratedScheduler", "ParamGroup", "WrapperError"]


class WrapperError(RuntimeError):
    """An optimizer / scheduler operation that would bypass the prepared training."""


class ParamGroup(MutableMapping):
    """The user's parameter group ``index``: epochal's groups of that index in every model part.

    Reading gives the first part's value (``"params"``: every part's parameters);
    writing sets every part's (see the module docstring for what sticks).
    """

    def __init__(self, optimizer: AcceleratedOptimizer, index: int) -> None:
        self._optimizer = optimizer
        self._index = index

    def _groups(self) -> list[dict[str, Any]]:
        opts = self._optimizer._engine.trainer.optimizers.optimizers
        return [opt.param_groups[self._index] for opt in opts]

    def __getitem__(self, key: str) -> Any:
        groups = self._groups()
        if key == "params":
            return [p for g in groups for p in g["params"]]
        return groups[0][key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "params":
            raise WrapperError(
                "the parameters of a prepared optimizer's groups are fixed at prepare(): build "
                "the optimizer with the groups you want before preparing it"
            )
        for group in self._groups():
            group[key] = value
            if key == "lr" and not self._optimizer.lr_scheduled:
                group["max_lr"] = float(value)  # what the constant schedule writes back
            if key == "weight_decay" and not self._optimizer.wd_scheduled:
                group["start_wd"] = group["end_wd"] = float(value)

    def __delitem__(self, key: str) -> None:
        raise WrapperError(f"a prepared optimizer's group keeps its option {key!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups()[0])

    def __len__(self) -> int:
        return len(self._groups()[0])

    def __repr__(self) -> str:
        shown = {k: v for k, v in self._groups()[0].items() if k != "params"}
        return f"ParamGroup({self._index}, {shown})"


class AcceleratedOptimizer:
    """The prepared optimizer (see the module docstring).

    Args:
        engine: the prepared model (:class:`~epochal.accelerate.engine.MegatronEngine`).
        optimizer: the user's optimizer object (kept as ``.optimizer``).
        lr_scheduled: a scheduler prepared with it drives the learning rate.
    """

    def __init__(self, engine: Any, optimizer: Any, *, lr_scheduled: bool = False) -> None:
        self._engine = engine
        self.optimizer = optimizer
        self.lr_scheduled = lr_scheduled
        style = engine.trainer.config.scheduler.weight_decay_incr_style
        #: the weight decay follows MegatronLMPlugin's schedule (start -> end weight decay)
        self.wd_scheduled = style != "constant"

    @property
    def param_groups(self) -> list[ParamGroup]:
        """The user's groups over epochal's parameters (``lr``: the one the next step uses)."""
        count = len(self._engine.trainer.optimizers.optimizers[0].param_groups)
        return [ParamGroup(self, i) for i in range(count)]

    @property
    def defaults(self) -> dict[str, Any]:
        """The user's optimizer defaults."""
        return self.optimizer.defaults

    @property
    def step_was_skipped(self) -> bool:
        """Whether the last train step skipped its update (fp16 overflow, non-finite gradients)."""
        return bool(self._engine.last_metrics.get("skipped", 0))

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Apply a step's waiting update (a plain loop without a Megatron-LM plugin: see
        :mod:`epochal.accelerate.engine`); else nothing: ``model(**batch)`` stepped it."""
        self._engine.complete_step()

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
