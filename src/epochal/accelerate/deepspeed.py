"""``DummyOptim`` / ``DummyScheduler``: Accelerate's DeepSpeed placeholders, refused at ``prepare``.

A script may build them (Accelerate's examples do when a DeepSpeed config holds the
optimizer); ``accelerator.prepare`` refuses them: epochal has no DeepSpeed, so give
a ``torch.optim`` optimizer and a ``torch.optim.lr_scheduler`` scheduler (or
``MegatronLMDummyScheduler``). ``accelerator.state.deepspeed_plugin`` is ``None``,
as in Accelerate without DeepSpeed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DummyOptim", "DummyScheduler", "deepspeed_refusal"]


class DummyOptim:
    """Accelerate's ``DummyOptim(params, lr, weight_decay, **kwargs)`` (refused at ``prepare``)."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Accelerate's ``DummyScheduler(optimizer, total_num_steps, warmup_num_steps, ...)`` (refused)."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int | None = None,
        warmup_num_steps: int = 0,
        lr_scheduler_callable: Any = None,
        **kwargs: Any,
    ):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


def deepspeed_refusal(obj: Any) -> str | None:
    """The refusal message for a DeepSpeed placeholder (ours or Accelerate's), else None."""
    name = type(obj).__name__
    if name == "DummyOptim":
        return (
            "DummyOptim: DeepSpeed is not supported by epochal; build a torch.optim optimizer "
            "(e.g. torch.optim.AdamW(model.parameters(), lr=...)) and prepare it"
        )
    if name == "DummyScheduler":
        return (
            "DummyScheduler: DeepSpeed is not supported by epochal; build a "
            "torch.optim.lr_scheduler scheduler (e.g. transformers.get_scheduler(...)) or "
            "MegatronLMDummyScheduler and prepare it"
        )
    return None
