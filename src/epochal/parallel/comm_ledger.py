"""A ledger of the collectives a training step issues: calls and bytes per kind and group, per rank.

:class:`CommLedger` is a ``TorchDispatchMode``: while it is entered, every
collective that reaches PyTorch's dispatcher on this rank is counted, whichever
way it was issued:

- ``torch.distributed``'s functions (``all_reduce``, ``all_gather``,
  ``reduce_scatter_tensor``, ``broadcast``, ``all_to_all_single``, ``send`` /
  ``recv`` / ``isend`` / ``irecv`` and ``batch_isend_irecv``, ...) and the
  process-group methods they call, which dispatch as the ``c10d::*`` operators:
  epochal's own reductions, FSDP2's gradient all-reduce / reduce-scatter and
  parameter all-gathers, the pipeline schedules' point-to-point messages;
- the functional collectives (``_c10d_functional::*`` and their autograd
  versions) that DTensor's redistributions issue: tensor and sequence
  parallelism's all-reduces, all-gathers and reduce-scatters, forward and
  backward. Like PyTorch's ``CommDebugMode``, the mode steps aside for DTensor
  operators (returns ``NotImplemented``) so that DTensor runs and the
  collectives it lowers to come back to the mode on plain tensors.

Not counted: collectives issued from a thread that did not enter the mode
(PyTorch runs the autograd engine's CPU work and FSDP2's hooks on the calling
thread, so a training step's are all seen; CUDA backward runs on device threads
that inherit the mode), traffic inside a backend that never reaches the
dispatcher (the store's TCP traffic at start-up, NCCL's own protocol overhead),
anything a compiled graph (``torch.compile``) issues once captured, and
the functional ``batch_p2p_ops`` (epochal does not use it). The
ledger counts what is *issued*; whether it overlaps with compute is the
projection's business (``docs/concepts/communication.md``).

Bytes: for every call two figures, following nccl-tests' conventions
(``PERFORMANCE.md`` there):

- ``bytes``: the collective's size ``S`` as nccl-tests defines it: the
  reduced / broadcast / sent tensor, the *gathered* output of an all-gather, the
  *full* input of a reduce-scatter, the input of an all-to-all (all local ranks'
  element sizes as stored: fp32 = 4 bytes);
- ``bus_bytes``: ``S`` times the bus factor of a ring over the group's ``n``
  ranks, i.e. the bytes each rank puts on its link: ``2(n-1)/n`` for
  all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, ``1``
  for broadcast and send, ``0`` for a receive (the sender's link carries it).
  ``bus_bytes / link bandwidth`` is the time a collective takes at the link's
  full speed.

Zero cost when off: nothing is patched or registered; the ledger only exists
inside its ``with`` block. Inside, every operator passes through one Python
function, so a step under the ledger runs slower: use it to count, not to time.

Example::

    with CommLedger(groups={"dp": mesh.get_group("dp")}) as ledger:
        for batch in batches:
            train_step(batch)
            ledger.end_step()
    ledger.per_step()   # {(kind, group): (calls, bytes, bus_bytes)} averaged over the steps
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["CommLedger", "Entry"]

_C10D = torch.ops.c10d
_FUNCOL = torch.ops._c10d_functional
_AUTOGRAD = torch.ops._c10d_functional_autograd


def _kinds() -> dict[Any, tuple[str, str]]:
    """Operator packet -> (kind, how its size is read: ``all`` / ``out`` / ``in`` / ``in_x_n``)."""
    table = {
        "all_reduce": [
            (_C10D.allreduce_, "all"),
            (_C10D.allreduce_coalesced_, "all"),
            (_FUNCOL.all_reduce, "all"),
            (_FUNCOL.all_reduce_, "all"),
            (_FUNCOL.all_reduce_coalesced, "all"),
            (_FUNCOL.all_reduce_coalesced_, "all"),
        ],
        "all_gather": [
            (_C10D.allgather_, "out"),
            (_C10D._allgather_base_, "out"),
            (_C10D.allgather_coalesced_, "out"),
            (_C10D.allgather_into_tensor_coalesced_, "out"),
            (_FUNCOL.all_gather_into_tensor, "in_x_n"),
            (_FUNCOL.all_gather_into_tensor_out, "in_x_n"),
            (_FUNCOL.all_gather_into_tensor_coalesced, "in_x_n"),
            (_AUTOGRAD.all_gather_into_tensor, "in_x_n"),
        ],
        "reduce_scatter": [
            (_C10D.reduce_scatter_, "in"),
            (_C10D._reduce_scatter_base_, "in"),
            (_C10D.reduce_scatter_tensor_coalesced_, "in"),
            (_FUNCOL.reduce_scatter_tensor, "in"),
            (_FUNCOL.reduce_scatter_tensor_out, "in"),
            (_FUNCOL.reduce_scatter_tensor_coalesced, "in"),
            (_AUTOGRAD.reduce_scatter_tensor, "in"),
        ],
        "all_to_all": [
            (_C10D.alltoall_, "in"),
            (_C10D.alltoall_base_, "in"),
            (_FUNCOL.all_to_all_single, "in"),
            (_AUTOGRAD.all_to_all_single, "in"),
        ],
        "broadcast": [
            (_C10D.broadcast_, "all"),
            (_FUNCOL.broadcast, "all"),
            (_FUNCOL.broadcast_, "all"),
        ],
        "send": [(_C10D.send, "all"), (_FUNCOL.isend, "all")],
        "recv": [(_C10D.recv_, "all"), (_C10D.recv_any_source_, "all"), (_FUNCOL.irecv, "all")],
        "gather": [(_C10D.gather_, "in_x_n")],
        "scatter": [(_C10D.scatter_, "out_x_n")],
        "reduce": [(_C10D.reduce_, "all")],
        "barrier": [(_C10D.barrier, "none"), (_C10D.monitored_barrier_, "none")],
    }
    return {packet: (kind, how) for kind, rows in table.items() for packet, how in rows}


#: The bus factor of each kind over ``n`` ranks (nccl-tests' ring conventions).
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "reduce": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}


@dataclass
class Entry:
    """What one (kind, group) cost in one step on this rank.

    Attributes:
        calls: collectives issued.
        bytes: their total size ``S`` (nccl-tests' convention, see the module docstring).
        bus_bytes: their total bytes on this rank's link (``S`` times the bus factor).
    """

    calls: int = 0
    bytes: int = 0
    bus_bytes: float = 0.0


def _nbytes(values: Any) -> int:
    leaves, _ = tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


class CommLedger(TorchDispatchMode):
    """Count this rank's collectives, per step, by kind and process group.

    Args:
        groups: names of the process groups to report by name (for example the
            mesh's ``{"dp": mesh.get_group("dp"), "tp": ...}``); a group not
            named is reported as ``world`` when it spans every rank, else by its
            global ranks (``ranks 0,2``). ``None`` values are skipped. Two named
            groups over the same ranks (expert parallelism's ``ep`` group and
            ``dp`` when ``expert_parallel`` equals the data-parallel size) keep
            their own names.
    """

    def __init__(self, groups: Mapping[str, dist.ProcessGroup | None] | None = None) -> None:
        super().__init__()
        self._kinds = _kinds()
        self._named = {
            tuple(dist.get_process_group_ranks(g)): name
            for name, g in (groups or {}).items()
            if g is not None
        }
        self._by_group = {g.group_name: name for name, g in (groups or {}).items() if g is not None}
        self._labels: dict[Any, tuple[str, int]] = {}
        self.steps: list[dict[tuple[str, str], Entry]] = []
        #: per closed step, every call in issue order: ``(kind, group label, bytes)``
        self.calls: list[list[tuple[str, str, int]]] = []
        self._current: dict[tuple[str, str], Entry] = defaultdict(Entry)
        self._current_calls: list[tuple[str, str, int]] = []

    def _group(self, func: Any, args: tuple, kwargs: dict) -> tuple[str, int]:
        """(label, size) of the process group a collective runs on."""
        values = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
        group = values.get("process_group", values.get("group_name"))
        if isinstance(group, torch.ScriptObject):  # a c10d operator's boxed group
            group = dist.ProcessGroup.unbox(group)
        key = group if isinstance(group, str) else group.group_name  # the boxes are temporary
        if key not in self._labels:
            if isinstance(group, str):
                from torch.distributed.distributed_c10d import _resolve_process_group

                group = _resolve_process_group(group)
            ranks = tuple(dist.get_process_group_ranks(group))
            if key in self._by_group:
                label = self._by_group[key]
            elif ranks in self._named:
                label = self._named[ranks]
            elif len(ranks) == dist.get_world_size():
                label = "world"
            else:
                label = "ranks " + ",".join(map(str, ranks))
            self._labels[key] = (label, len(ranks))
        return self._labels[key]

    def _record(self, func: Any, kind: str, how: str, args: tuple, kwargs: dict) -> None:
        label, n = self._group(func, args, kwargs)
        c10d = func.namespace == "c10d"  # (outputs, inputs, group, ...); functional: (input, ...)
        tensors = [a for a in args if isinstance(a, (torch.Tensor, list, tuple))]
        if how == "all":
            size = _nbytes(tensors)
        elif how == "out":
            size = _nbytes(tensors[0])
        elif how == "in":
            size = _nbytes(tensors[1] if c10d else tensors[0])
        elif how == "in_x_n":
            size = _nbytes(tensors[1] if c10d else tensors[0]) * n
        elif how == "out_x_n":
            size = _nbytes(tensors[0]) * n
        else:
            size = 0
        entry = self._current[(kind, label)]
        entry.calls += 1
        entry.bytes += size
        entry.bus_bytes += size * BUS_FACTOR[kind](n)
        self._current_calls.append((kind, label, size))

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) for t in types):
            return (
                NotImplemented  # let DTensor run: its collectives come back here on plain tensors
            )
        found = self._kinds.get(func._overloadpacket)
        if found is not None:
            self._record(func, *found, args, kwargs)
        return func(*args, **kwargs)

    def end_step(self) -> None:
        """Close the current step: what was counted since the last call is one step."""
        self.steps.append(dict(self._current))
        self.calls.append(self._current_calls)
        self._current = defaultdict(Entry)
        self._current_calls = []

    def per_step(self, skip: int = 0) -> dict[tuple[str, str], Entry]:
        """The mean per step over the closed steps after the first ``skip``.

        Returns:
            ``{(kind, group label): Entry}`` with ``calls`` and ``bytes`` as
            floats when the steps differ (integers when they agree).

        Raises:
            ValueError: no closed step after ``skip``.
        """
        steps = self.steps[skip:]
        if not steps:
            raise ValueError(f"CommLedger.per_step: no step after the first {skip} (call end_step)")
        out: dict[tuple[str, str], Entry] = {}
        for key in sorted({k for s in steps for k in s}):
            rows = [s.get(key, Entry()) for s in steps]
            calls = sum(r.calls for r in rows)
            size = sum(r.bytes for r in rows)
            bus = sum(r.bus_bytes for r in rows)
            k = len(rows)
            out[key] = Entry(
                calls=calls // k if calls % k == 0 else calls / k,
                bytes=size // k if size % k == 0 else size / k,
                bus_bytes=bus / k,
            )
        return out
