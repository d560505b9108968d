"""Weight gradients completed over the context-parallel group once per micro-batch, after its backward.

Under context parallelism in canonical units a rank's weight gradient is its
subtree of the folded token tree (:func:`~epochal.parallel.canonical.folded_token_sum`),
which the group completes with one more level, ``r0 + r1`` (recursive halving in
larger groups). Completed inside each linear's and norm's backward, that is a
blocking collective per parameter, dozens per micro-batch, each a point where a
rank's computation stops until the bytes are summed. The completions depend on
nothing computed after them in the backward pass, so they can wait:
:class:`DeferredCompletion` puts a model part's parameters through one identity
node, created when the part's forward begins (:meth:`DeferredCompletion.open`).
The canonical ops return their local subtrees through it, and autograd runs its
backward once every gradient of the micro-batch has arrived. The node then starts
every completion at once (asynchronously, in backward order), waits for them all
and hands the whole gradients on to the parameters, which accumulate them over the
micro-batches as before. Each element gets the same operands, summed by the same
collective, as the per-op completion gives it (two operands in a group of two, the
same tree in larger ones), so the bits do not change: only the number of waits does.

What completes in its op as before: a parameter on its second use in a forward
(tied embeddings: :meth:`DeferredCompletion.register` leaves out parameters that
several modules share), and everything under autocast (the ops compute in the
autocast dtype, and their completion must add in it). The engine defers only
without data parallelism: FSDP2 swaps a unit's parameters in and out around its
forward and reduces them in its post-backward hooks, which expect the gradients
by then.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.parallel.canonical import Reductions, start_tree_all_reduce

__all__ = ["DeferredCompletion"]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class _Complete(torch.autograd.Function):
    """Identity on the parameters in the forward; the backward completes their gradients over the group."""

    @staticmethod
    def forward(ctx: Any, cp: Reductions, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.cp = cp
        return tuple(w.view_as(w) for w in weights)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        # every completion started, then waited for: one wait, not one per op
        started = [None if g is None else start_tree_all_reduce(g, ctx.cp) for g in grads]
        return (None, *(None if finish is None else finish() for finish in started))


class DeferredCompletion:
    """The identity node through which a model part's canonical parameters take their gradients (module docstring).

    Args:
        cp: the context-parallel units (``Reductions.cp``) that complete the gradients.
    """

    def __init__(self, cp: Reductions) -> None:
        self.cp = cp
        self.modules: list[tuple[nn.Module, str]] = []
        self._open: dict[int, torch.Tensor] = {}

    def __deepcopy__(self, memo: dict[int, object]) -> DeferredCompletion:
        """A copy for a copied model: its modules' parameters, no forward open."""
        out = DeferredCompletion(self.cp)
        out.modules = [(copy.deepcopy(m, memo), n) for m, n in self.modules]
        return out

    def register(self, module: nn.Module, *names: str, shared: Collection[int] = ()) -> None:
        """The parameters ``names`` of ``module`` (those it has, not in ``shared``) complete through the node.

        Args:
            module: a module computing with canonical ops.
            names: its parameters' names (``"weight"``, ``"bias"``).
            shared: ids of parameters that several modules use (left to their ops).
        """
        for name in names:
            param = module._parameters.get(name)
            if isinstance(param, nn.Parameter) and id(param) not in shared:
                self.modules.append((module, name))

    def open(self, *_: Any) -> None:
        """Start a forward: a fresh node over the parameters that take gradients (a forward pre-hook)."""
        self._open = {}
        if not torch.is_grad_enabled() or not self.modules:
            return
        params = [getattr(m, n) for m, n in self.modules]
        params = [p for p in dict.fromkeys(params) if p is not None and p.requires_grad]
        if not params:
            return
        gated = _Complete.apply(self.cp, *(_local(p) for p in params))
        self._open = {id(p): g for p, g in zip(params, gated)}

    def take(self, param: torch.Tensor | None) -> tuple[torch.Tensor | None, bool]:
        """``(tensor, complete)``: the parameter's tensor for an op, and whether the op completes its gradient.

        The node's output on the parameter's first use in this forward (the node
        completes its gradient), else the parameter's local tensor (the op does).
        """
        if param is None:
            return None, True
        gated = self._open.pop(id(param), None)
        if gated is None or torch.is_autocast_enabled(gated.device.type):
            return _local(param), True
        return gated, False
