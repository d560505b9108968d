"""``LocalSGD``: Accelerate's periodic model averaging, with what it means on epochal.

Accelerate's ``LocalSGD(accelerator, model, local_sgd_steps, enabled)`` lets each
data-parallel process step on its own and averages the models every
``local_sgd_steps`` steps. With one data-parallel replica (one process, or tensor /
pipeline parallelism only) averaging over one replica changes nothing, so it is
honoured exactly: the context manager and ``step()`` do nothing. With several
replicas epochal's train step all-reduces the gradients every step (plain
synchronous data parallelism, which Local SGD approximates), so construction is
refused, saying to drop ``LocalSGD`` (or pass ``enabled=False``) or use one
data-parallel replica. Accelerate itself refuses ``LocalSGD`` under Megatron-LM.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

__all__ = ["LocalSGD", "LocalSGDError"]


class LocalSGDError(ValueError):
    """``LocalSGD`` on several data-parallel replicas (epochal synchronises every step)."""


class LocalSGD:
    """Accelerate's ``LocalSGD`` (see the module docstring).

    Raises:
        LocalSGDError: ``enabled`` with more than one data-parallel replica.
    """

    def __init__(
        self, accelerator: Any, model: Any, local_sgd_steps: int, enabled: bool = True
    ) -> None:
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = int(local_sgd_steps)
        self.enabled = bool(enabled)
        self.num_steps = 0
        plugin = accelerator.state.megatron_lm_plugin
        replicas = accelerator.num_processes // (
            plugin.tp_degree * plugin.cp_degree * plugin.pp_degree
        )
        if self.enabled and replicas > 1:
            raise LocalSGDError(
                f"LocalSGD with {replicas} data-parallel replicas: epochal's train step "
                "averages the gradients over them every step (synchronous data parallelism); "
                "drop LocalSGD (or pass enabled=False), or run one data-parallel replica"
            )

    def __enter__(self) -> LocalSGD:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def step(self) -> None:
        """Count the step; averaging one replica changes nothing."""
        self.num_steps += 1
