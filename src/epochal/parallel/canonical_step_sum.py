"""Weight gradients whose context-parallel chunks are summed once per step.

In canonical units a linear's weight gradient is a sum over tokens cut into ``C``
leaves (``parallel.invariant_context_degree``; leaf ``j`` is sequence chunk ``j``
and its mirror, :func:`~epochal.parallel.canonical.folded_tree`), and a step adds
``m`` micro-batches. Floating-point addition does not commute with regrouping, so
the two sums must nest the same way on every layout. Two nestings are exact:

- ``micro_batch`` (the default): ``sum_k tree_j(leaf[j, k])``, each micro-batch's gradient
  completed over the context-parallel group, then accumulated. One gradient buffer
  on every layout, but the group sums every micro-batch's gradient (the bytes of
  ``m`` all-reduces per step, where plain context parallelism sends one).
- ``step`` (this module, ``parallel.invariant_context_accumulation=step``): ``tree_j(sum_k leaf[j, k])``, each leaf accumulated over
  the micro-batches on its own (the first copied, the others added in order, as
  autograd accumulates a ``.grad``), the tree added once at the end of the step.
  A context-parallel rank that holds one leaf (``context_parallel = C``)
  accumulates it in the parameter's own ``.grad`` (through autograd and, with data
  parallelism, the ordered reducer's global micro-batch order), and the group
  completes the tree once per step: plain context parallelism's bytes. A rank that
  holds several leaves (fewer ranks than ``C``: one process replaying a CP run)
  keeps one accumulator per leaf in a :class:`LeafSink` and adds them as the
  subtree before completing. Under data parallelism the ordered reducer
  (:mod:`~epochal.parallel.ordered_reduce`) takes each micro-batch's leaves from the
  sink instead and accumulates each one in the global micro-batch order (the bytes of
  a reduce-scatter per leaf and micro-batch), adds their shards as the subtree and
  installs it as the gradient, which this module then completes over the group.

:class:`StepSums` holds a model part's weights that sum this way; the canonical
ops ask it (:meth:`StepSums.take`) how to hand on their weight gradients, the step
calls :func:`begin_step_sums` before its first micro-batch and
:func:`finish_step_sums` after the last backward (and the data-parallel
reduction), before the gradient norm. What stays per micro-batch in either order:
embedding tables, norms and biases (small sums over ``2 D`` chunks), and a weight
that two modules share (a tied output head).

Errors: :class:`ValueError` naming ``parallel.invariant_context_accumulation`` where
a rank would hold several leaves under ``torch.compile`` (:func:`step_sums_order`); :class:`RuntimeError` when a summed weight already has a
gradient at the end of the step (a second use this module did not see).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from epochal.parallel.canonical import (
    Reductions,
    folded_token_sum,
    folded_tree,
    start_tree_all_reduce,
)

__all__ = [
    "LeafSink",
    "StepSums",
    "begin_step_sums",
    "finish_step_sums",
    "step_sums_order",
    "weight_gradient",
]


def step_sums_order(config: Any, *, cp: int, compile: bool) -> bool:
    """Whether a run's linears sum their weight gradients' chunks once per step.

    Args:
        config: the run's :class:`~epochal.parallel.config.ParallelConfig`.
        cp: this layout's context-parallel size.
        compile: ``training.compile``.

    Raises:
        ValueError: ``step`` where a rank holds several chunks of each weight gradient
            (``context_parallel`` below ``invariant_context_degree``) under
            ``torch.compile``.
    """
    if config.invariant_context_accumulation != "step":
        return False
    degree = config.invariant_context_degree
    if degree > cp and compile:
        raise ValueError(
            "parallel.invariant_context_accumulation=step with training.compile needs "
            f"context_parallel == parallel.invariant_context_degree (here {cp} and {degree}): "
            "a rank holding several sequence chunks keeps one gradient buffer per chunk "
            "outside autograd, which torch.compile does not trace. Resume with "
            f"context_parallel={degree} or training.compile=false, or train the run with "
            "parallel.invariant_context_accumulation=micro_batch from its start"
        )
    return True


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class LeafSink:
    """One weight's per-leaf accumulators over a step's micro-batches (a rank holding ``count`` leaves).

    Args:
        param: the parameter whose gradient the leaves sum to.
        count: the leaves this rank holds (``C / context_parallel`` > 1).
    """

    def __init__(self, param: nn.Parameter, count: int) -> None:
        self.param = param
        self.count = count
        self.sums: list[torch.Tensor | None] = [None] * count

    def add(self, j: int, leaf: torch.Tensor) -> None:
        """Accumulate this micro-batch's leaf ``j`` (a fresh tensor of the local weight's shape)."""
        leaf = leaf.to(_local(self.param).dtype)
        held = self.sums[j]
        if held is None:
            self.sums[j] = leaf.contiguous()  # the first micro-batch's, as autograd keeps it
        else:
            held.add_(leaf)

    def take_leaves(
        self,
        leaf: Callable[[int, int | None], torch.Tensor],
        count: int,
        layout: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """Every local leaf of one micro-batch, computed one at a time and accumulated.

        Args:
            leaf: ``leaf(j, mirror)`` as :func:`~epochal.parallel.canonical.folded_tree` takes it.
            count: the local sequence chunks (``2 * self.count``).
            layout: the leaf's result in the weight's layout.
        """
        if count != 2 * self.count:
            raise ValueError(f"{count} sequence chunks do not hold {self.count} leaves")
        for j in range(self.count):
            self.add(j, layout(leaf(j, count - 1 - j)))

    def subtree(self) -> torch.Tensor | None:
        """The accumulators added as the folded tree (consumed), or None if none arrived."""
        if any(s is None for s in self.sums):
            if all(s is None for s in self.sums):
                return None
            raise RuntimeError("a weight's step sums are missing some of their sequence chunks")
        sums, self.sums = self.sums, [None] * self.count
        return folded_tree(lambda j, m: sums[j], 2 * self.count)

    def pop(self, j: int) -> torch.Tensor | None:
        """Leaf ``j`` as accumulated so far (this micro-batch's, for the reducer), emptied."""
        held, self.sums[j] = self.sums[j], None
        return held


def weight_gradient(
    leaf: Callable[[int, int | None], torch.Tensor],
    red: Reductions,
    count: int,
    complete: bool | LeafSink,
    layout: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
) -> torch.Tensor | None:
    """A canonical op's weight gradient: the folded token sum, or its leaves into ``complete``'s sink.

    Args:
        leaf: ``leaf(j, mirror)``: the product over local chunks ``j`` and ``mirror``.
        red: the units.
        count: the local sequence chunks.
        complete: True: completed over the context-parallel group; False: this rank's
            subtree (completed later); a :class:`LeafSink`: every leaf accumulated there.
        layout: the tree's result (or each leaf) in the weight's layout.

    Returns:
        The gradient, or None when the sink took it.
    """
    if isinstance(complete, LeafSink):
        complete.take_leaves(leaf, count, layout)
        return None
    return layout(folded_token_sum(leaf, red, count, complete=complete))


class StepSums:
    """A model part's weights whose chunk sums are accumulated over a step (module docstring).

    Args:
        cp: the context-parallel units that complete the trees (None without a group).
        leaves: the leaves this rank holds of each weight's tree (``C / cp``).

    Attributes:
        reduced: set by the data-parallel reducer that takes the sinks' leaves each
            micro-batch and installs each weight's subtree as its gradient.
    """

    def __init__(self, cp: Reductions | None, leaves: int) -> None:
        self.cp = cp
        self.leaves = leaves
        self.reduced = False
        self.modules: list[tuple[nn.Module, str]] = []
        self._sinks: dict[int, LeafSink] = {}

    def __deepcopy__(self, memo: dict[int, object]) -> StepSums:
        """A copy for a copied model: its modules' parameters, nothing accumulated."""
        out = StepSums(self.cp, self.leaves)
        out.modules = [(copy.deepcopy(m, memo), n) for m, n in self.modules]
        return out

    def holds(self, module: nn.Module, name: str) -> bool:
        """Whether ``module``'s parameter ``name`` sums this way."""
        return any(m is module and n == name for m, n in self.modules)

    def register(self, module: nn.Module, name: str = "weight") -> bool:
        """Sum ``module``'s parameter ``name`` this way; False when it has none."""
        param = module._parameters.get(name)
        if not isinstance(param, nn.Parameter):
            return False
        self.modules.append((module, name))
        return True

    def sink(self, module: nn.Module) -> LeafSink:
        """The leaf accumulators of ``module``'s weight (made on first use)."""
        sink = self._sinks.get(id(module))
        if sink is None:
            sink = self._sinks[id(module)] = LeafSink(module.weight, self.leaves)
        return sink

    def take(self, module: nn.Module, param: torch.Tensor) -> tuple[torch.Tensor, bool | LeafSink]:
        """``(tensor, complete)`` for an op on ``module``'s weight ``param`` (the tensor the
        forward sees): the local tensor, and False (one leaf) or the module's sink."""
        if self.leaves == 1:
            return _local(param), False
        return _local(param), self.sink(module)

    def begin(self) -> None:
        """Drop what a step that did not finish left in the sinks."""
        for sink in self._sinks.values():
            sink.sums = [None] * sink.count

    @torch.no_grad()
    def finish(self) -> None:
        """Complete every weight's tree over the group and leave it in ``.grad``."""
        started: list[tuple[nn.Parameter, Any]] = []
        in_grad = self.leaves == 1 or self.reduced  # the tree's local part is in .grad
        for module, name in self.modules:
            param = getattr(module, name)
            if in_grad:
                if param.grad is None:
                    continue
                local = _local(param.grad)
            else:
                sink = self._sinks.get(id(module))
                local = sink.subtree() if sink is not None else None
                if local is None:
                    continue
                if param.grad is not None:
                    raise RuntimeError(
                        "a weight summed per sequence chunk over the step also has a gradient "
                        "of another use; parallel.invariant_context_accumulation=micro_batch "
                        "sums such a model"
                    )
            finish = start_tree_all_reduce(local, self.cp) if self.cp is not None else None
            started.append((param, (local, finish)))
        for param, (local, finish) in started:
            whole = finish() if finish is not None else local
            if in_grad:
                held = _local(param.grad)
                if whole is not held:
                    held.copy_(whole)
                continue
            whole = whole.contiguous()
            if isinstance(param, DTensor):
                whole = DTensor.from_local(
                    whole,
                    param.device_mesh,
                    param.placements,
                    shape=param.shape,
                    stride=param.stride(),
                )
            param.grad = whole


def _of(parts: Iterable[nn.Module]) -> list[StepSums]:
    return [s for s in (p.__dict__.get("canonical_step_sums") for p in parts) if s is not None]


def begin_step_sums(parts: Iterable[nn.Module]) -> None:
    """Before a step's first micro-batch: every part's sinks empty."""
    for sums in _of(parts):
        sums.begin()


def finish_step_sums(parts: Iterable[nn.Module]) -> None:
    """After a step's last backward (and its data-parallel reduction): the trees completed."""
    for sums in _of(parts):
        sums.finish()
