"""``Accelerator(gradient_accumulation_steps=N)``: Accelerate's accumulation as Megatron micro-batches.

Accelerate accumulates the gradients of ``N`` loader batches (each the
``DataLoader``'s ``batch_size`` per process) and steps the optimizer on the last
one, with ``accelerator.backward`` dividing each loss by ``N``: the update is
that of the mean loss over ``N x batch_size x processes`` samples, and the
``lr_scheduler`` advances only on that step. epochal's train step does exactly
this with ``N`` micro-batches (the loss averaged over them), so
``gradient_accumulation_steps=N`` (or ``GradientAccumulationPlugin(num_steps=N)``)
sets ``MegatronLMPlugin.num_micro_batches = N``: the prepared train loader yields
one global batch of ``N`` micro-batches per iteration, and every
``model(**batch)`` inside ``with accelerator.accumulate(model):`` is the last
micro-batch's step (``sync_gradients`` is true there, as on Accelerate's
stepping iteration). The loss it returns is the mean over the ``N``
micro-batches (Accelerate's script prints the last micro-batch's); the schedule,
the weights and the samples read per step are Accelerate's. A plugin that sets
another ``num_micro_batches`` than ``N`` is refused.
"""

from __future__ import annotations

from typing import Any

from epochal.accelerate.state import AcceleratorError

__all__ = ["apply_gradient_accumulation"]


def apply_gradient_accumulation(plugin: Any, steps: int, accumulation_plugin: Any) -> int:
    """Set ``plugin.num_micro_batches`` from Accelerate's accumulation options; returns ``N``.

    Raises:
        AcceleratorError: ``N`` < 1, or the plugin already asks for another number of
            micro-batches (named).
    """
    n = int(getattr(accumulation_plugin, "num_steps", steps))
    if n < 1:
        raise AcceleratorError(f"gradient_accumulation_steps={n}: give 1 or more")
    if n == 1:
        return int(plugin.num_micro_batches or 1)
    current = int(plugin.num_micro_batches or 1)
    if current not in (1, n):
        raise AcceleratorError(
            f"gradient_accumulation_steps={n} but MegatronLMPlugin(num_micro_batches={current}): "
            "both are the micro-batches of one step; give one of them"
        )
    plugin.num_micro_batches = n
    return n
