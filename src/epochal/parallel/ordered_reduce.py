"""Gradients summed in one fixed order, whatever the data-parallel size and accumulation.

Floating-point addition is not associative, so a gradient summed as
``((g0 + g1) + g2) + g3`` (one process, four accumulated micro-batches) and as
``(g0 + g2) + (g1 + g3)`` (two data-parallel ranks each accumulating two, then
an all-reduce) differ in the last bits, and the runs drift apart. The canonical
order here is the one a single process uses: the *sequential* sum over the
global micro-batch index ``k`` (``k = i * dp + r`` for micro-batch ``i`` of
data-parallel rank ``r``, the samplers' order), each micro-batch's gradient being
what one backward pass produces (autograd adds the uses of a tied weight within a
pass before it accumulates).

:class:`OrderedGradReducer` keeps that order under data parallelism. The
data-parallel wrapper's own reduction is switched off; in the backward pass of
every local micro-batch ``i``, as soon as autograd has accumulated all gradients
of a unit (an FSDP2 parameter group), each rank cuts them into the data-parallel
shards (FSDP2's dim-0 chunks), frees them and exchanges the shards with one
all-to-all: the owner of a shard receives the gradients of the micro-batches
``i * dp, ..., i * dp + dp - 1`` (in rank order) and adds them to its
accumulator one after the other, the first copied, exactly as autograd
accumulates them in one process. After the last micro-batch the accumulator is
the shard's gradient (``dp_sharding`` ``optimizer``/``full``) or is all-gathered
into the full gradient (``none``). The traffic per micro-batch equals one
reduce-scatter; with gradient accumulation that is once per micro-batch
instead of once per step. Each exchange runs in the background while the
rest of the backward pass (or the next micro-batch) computes and is added before
the next exchange starts, so its time hides behind the computation
where the hardware allows; one exchange is in flight at a time, so the memory it
adds is one bucket's send and receive buffers (a unit, cut at parameter
boundaries into buckets of at most ``bucket_numel`` elements).

Pipeline parallelism: the reducer runs after each stage's backward of each
micro-batch. The two copies of a tied embedding (stage 0's input embedding, the
last stage's output head) are added per micro-batch, as autograd adds the two
uses in one process: the last stage sends its copy's gradient to stage 0 after
each backward, stage 0 adds it to its own before accumulating, and at the end
sends the result back.

Canonical units with the context-parallel weight gradients summed once per step
(:mod:`~epochal.parallel.canonical_step_sum`) on a rank that holds several of a
weight's sequence-chunk leaves: the weight gets one slot per leaf, taken from its
sink after each micro-batch (no gradient reaches ``.grad``), each leaf accumulated in
the global order like any gradient; at the end the leaves' pieces are added as the
folded tree and installed as the weight's gradient (the step then completes it over
the context-parallel group).

Tensor parallelism: gradients that are partial sums over the tensor-parallel
ranks are accumulated as partial sums and summed over those ranks once at the
end in rank order (:func:`ordered_sum`), in every layout (also without data
parallelism: :func:`finalize_partial_grads`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule  # also registers torch.ops.fsdp.chunk_cat
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial

from epochal.parallel.canonical_step_sum import LeafSink

__all__ = ["OrderedGradReducer", "finalize_partial_grads", "ordered_sum", "placed_grad"]


def _staged(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> bool:
    """Whether a collective on ``tensor`` must go through the CPU (gloo with CUDA tensors)."""
    return tensor.is_cuda and dist.get_backend(group) == "gloo"


def ordered_sum(local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The sum of every rank's ``local`` over ``group``, added in group-rank order (same bits everywhere).

    A replacement for ``all_reduce(SUM)``, whose order depends on the backend's
    algorithm and the tensor's size.

    Args:
        local: this rank's tensor (any shape, the same on every rank).
        group: the process group.

    Returns:
        A new tensor shaped like ``local``.
    """
    size = dist.get_world_size(group)
    if size == 1:
        return local.clone()
    staged = _staged(local, group)
    src = local.detach().cpu() if staged else local.detach().contiguous()
    parts = [torch.empty_like(src) for _ in range(size)]
    dist.all_gather(parts, src, group=group)
    out = parts[0].clone()
    for part in parts[1:]:
        out += part
    return out.to(local.device) if staged else out


def _resolve_partial(
    local: torch.Tensor, grad_placements: Sequence[Any], param_placements: Sequence[Any], mesh: Any
) -> torch.Tensor:
    """Sum ``local`` over the mesh dimensions where the gradient is ``Partial`` and the parameter not.

    ``grad_placements`` may differ from ``param_placements`` only there
    (:func:`_without_exact_moves` makes the other differences go away first).

    Raises:
        ValueError: a ``Partial`` gradient of a parameter that is not replicated
            there (it would need the sum before the sharding).
    """
    for d, (g, p) in enumerate(zip(grad_placements, param_placements)):
        if g == p:
            continue
        if isinstance(g, Partial) and p.is_replicate():
            local = ordered_sum(local, mesh.get_group(d))
            continue
        raise ValueError(
            f"training.layout_invariant: cannot reduce a gradient placed {tuple(grad_placements)} "
            f"onto a parameter placed {tuple(param_placements)}"
        )
    return local


def _without_exact_moves(grad: DTensor, target: Sequence[Any]) -> DTensor:
    """``grad`` redistributed to ``target`` except where it is ``Partial`` (kept for an ordered sum).

    What remains (``Shard`` <-> ``Replicate``) moves values without adding any.
    """
    keep = tuple(g if isinstance(g, Partial) else t for g, t in zip(grad.placements, target))
    return grad if keep == tuple(grad.placements) else grad.redistribute(placements=keep)


@torch.no_grad()
def finalize_partial_grads(parts: Sequence[nn.Module]) -> None:
    """Bring tensor-parallel gradients to their parameters' placements, ``Partial`` ones summed in rank order.

    For layouts without data parallelism: the layout-invariant counterpart of
    redistributing them (whose all-reduce adds in the backend's order).
    """
    for part in parts:
        for p in part.parameters():
            if isinstance(p.grad, DTensor) and isinstance(p, DTensor):
                p.grad = placed_grad(p, p.grad)


def placed_grad(param: DTensor, grad: DTensor) -> DTensor:
    """``grad`` in ``param``'s placements, ``Partial`` dimensions summed in rank order.

    Args:
        param: a tensor-parallel parameter.
        grad: a gradient of it, in any placements on the same mesh.

    Returns:
        ``grad`` itself when the placements already agree, else a new DTensor.
    """
    if grad.placements == param.placements:
        return grad
    g = _without_exact_moves(grad, param.placements)
    local = _resolve_partial(g._local_tensor, g.placements, param.placements, g.device_mesh)
    return DTensor.from_local(
        local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
    )


class _Slot:
    """One parameter as autograd sees it during a step, and how its gradient is installed.

    ``fsdp`` is FSDP2's ``FSDPParam`` of the parameter (its unsharded copy gets the
    backward's gradients), or None for a parameter without data parallelism.
    """

    def __init__(self, param: torch.Tensor, fsdp: Any = None) -> None:
        self.param = fsdp.sharded_param if fsdp is not None else param
        self.fsdp = fsdp
        if fsdp is not None:
            if fsdp.fsdp_placement.dim != 0:
                raise ValueError("training.layout_invariant needs FSDP's dim-0 sharding")
            shape = tuple(fsdp._orig_size)  # the tensor-parallel local shape
        else:
            shape = tuple((param._local_tensor if isinstance(param, DTensor) else param).shape)
        self.shape = shape or (1,)
        self.rows = self.shape[0]
        self.row_numel = int(torch.Size(self.shape[1:]).numel())
        self.grad_placements: tuple[Any, ...] | None = None
        self.grad_mesh: Any = None

    def take(self) -> torch.Tensor | None:
        """This micro-batch's local gradient (unsharded, tensor-parallel local), cleared from the parameter."""
        if self.fsdp is not None:
            fp = self.fsdp
            if not hasattr(fp, "_unsharded_param"):
                return None
            grad = fp.unsharded_accumulated_grad
            if grad is not None:
                fp.unsharded_accumulated_grad = None
            else:
                grad = fp.unsharded_param.grad
                fp.unsharded_param.grad = None
        else:
            grad = self.param.grad
            self.param.grad = None
        if grad is None:
            return None
        if hasattr(grad, "wait") and not isinstance(grad, DTensor):
            grad = grad.wait()
        if isinstance(grad, DTensor):
            target = self.local_param_placements()
            if target is not None:
                grad = _without_exact_moves(grad, target)
            self.grad_placements, self.grad_mesh = tuple(grad.placements), grad.device_mesh
            grad = grad._local_tensor
        return grad.detach().reshape(self.shape)

    def autograd_param(self) -> torch.Tensor | None:
        """The tensor autograd accumulates this parameter's gradient into (None: not yet built)."""
        if self.fsdp is None:
            return self.param
        return getattr(self.fsdp, "_unsharded_param", None)

    def local_param_placements(self) -> tuple[Any, ...] | None:
        """The tensor-parallel placements the installed local gradient must have (None: plain)."""
        if self.fsdp is not None:
            spec = getattr(self.fsdp, "_unsharded_dtensor_spec", None)
            return tuple(spec.placements) if spec is not None else None
        return tuple(self.param.placements) if isinstance(self.param, DTensor) else None

    def install(self, local: torch.Tensor) -> None:
        """Set the parameter's gradient from this rank's piece ``local`` (tensor-parallel partials summed)."""
        target = self.local_param_placements()
        if self.grad_placements is not None and target is not None:
            local = _resolve_partial(local, self.grad_placements, target, self.grad_mesh)
        if self.fsdp is not None:
            self.param.grad = self.fsdp.to_sharded_dtensor(local.reshape(self.fsdp.sharded_size))
        elif isinstance(self.param, DTensor):
            p = self.param
            self.param.grad = DTensor.from_local(
                local.reshape(p._local_tensor.shape),
                p.device_mesh,
                p.placements,
                shape=p.shape,
                stride=p.stride(),
            )
        else:
            self.param.grad = local.reshape(self.param.shape)


class _LeafSlot(_Slot):
    """Leaf ``j`` of a weight whose sequence chunks sum once per step, taken from its sink.

    ``tree`` (shared by the weight's leaf slots) collects the leaves' final pieces and
    adds them as the folded tree.
    """

    def __init__(self, fsdp: Any, sink: Any, j: int, tree: LeafSink) -> None:
        super().__init__(fsdp.sharded_param, fsdp)
        self.sink, self.j, self.tree = sink, j, tree

    def take(self) -> torch.Tensor | None:
        grad = self.sink().pop(self.j)
        return None if grad is None else grad.detach().reshape(self.shape)

    def autograd_param(self) -> torch.Tensor | None:
        return None  # never in .grad: the bucket is sent after the backward pass

    def install(self, local: torch.Tensor) -> None:
        self.tree.add(self.j, local)
        if all(t is not None for t in self.tree.sums):
            whole = self.tree.subtree()
            assert whole is not None
            super().install(whole)


class _Bucket:
    """Slots reduced together (one FSDP parameter group), with their offsets in a shard buffer."""

    def __init__(self, slots: list[_Slot], dp: int) -> None:
        self.slots = slots
        self.chunk_rows = [-(-s.rows // dp) for s in slots]
        self.offsets: list[int] = []
        total = 0
        for s, c in zip(slots, self.chunk_rows):
            self.offsets.append(total)
            total += c * s.row_numel
        self.shard_numel = total
        self.acc: torch.Tensor | None = None  # dp > 1: [shard_numel]
        self.local_acc: list[torch.Tensor | None] = [None] * len(slots)  # dp == 1
        self.seen = [False] * len(slots)
        #: the all-to-all in flight: (work, send, recv, device to copy recv to or None)
        self.pending: tuple[Any, torch.Tensor, torch.Tensor, torch.device | None] | None = None
        self.ready: set[int] = set()  # slots whose gradient this backward pass has accumulated
        self.sent = False  # this micro-batch's gradients are taken


class OrderedGradReducer:
    """Accumulate the gradients of every micro-batch in the global micro-batch order (module docstring).

    Args:
        parts: this rank's model parts (after data parallelism is applied).
        dp_group: the data-parallel group (None: one data-parallel rank).
        replicate: ``dp_sharding`` ``none`` (every rank keeps full gradients).
        tied: ``(role, param)`` of this rank's copy of a tied embedding under
            pipeline parallelism (``"first"`` on stage 0, ``"last"`` on the last
            stage), or None.
        tied_group: the two-rank group of the tied copies (None without them).
        bucket_numel: a unit larger than this many elements is exchanged in several
            buckets (at parameter boundaries), which bounds the buffers in flight.
    """

    def __init__(
        self,
        parts: Sequence[nn.Module],
        dp_group: dist.ProcessGroup | None,
        *,
        replicate: bool,
        tied: tuple[str, torch.Tensor] | None = None,
        tied_group: dist.ProcessGroup | None = None,
        bucket_numel: int = 1 << 22,
    ) -> None:
        self.dp_group = dp_group
        self.dp = dist.get_world_size(dp_group) if dp_group is not None else 1
        self.replicate = replicate
        self.tied_role, tied_param = tied if tied is not None else (None, None)
        self.tied_group = tied_group
        self.tied_slot: _Slot | None = None
        self._pending: list[tuple[Any, torch.Tensor]] = []
        self.buckets: list[list[_Bucket]] = []
        self._tied_part: int | None = None
        self._hooked = self._armed = False
        self._in_flight: _Bucket | None = None
        for index, part in enumerate(parts):
            groups = _fsdp_groups(part) if self.dp > 1 else []
            groups = [_leaf_slots(part, slots) for slots in groups]
            if not groups and tied_param is not None and _holds(part, tied_param):
                groups = [[_Slot(tied_param)]]
            buckets = []
            for slots in _split(groups, bucket_numel):
                kept = []
                for slot in slots:
                    if tied_param is not None and slot.param is tied_param:
                        self.tied_slot, self._tied_part = slot, index
                        if self.tied_role == "last":
                            continue  # its gradient comes from stage 0
                    kept.append(slot)
                if kept:
                    buckets.append(_Bucket(kept, self.dp))
            self.buckets.append(buckets)

    @property
    def active(self) -> bool:
        """Whether the reducer has anything to do (data parallelism or tied pipeline copies)."""
        return self.tied_slot is not None or any(self.buckets)

    # ------------------------------------------------------------ per micro-batch
    @torch.no_grad()
    def arm(self) -> None:
        """Before a micro-batch's backward pass (without pipeline parallelism): send early.

        Each bucket's gradients are then taken and sent as soon as autograd has
        accumulated all of them (a hook per parameter), during the backward pass, so
        a unit's unsharded gradients are freed as early as FSDP's own reduction frees
        them; :meth:`after_backward` takes the rest (parameters without a gradient).
        """
        if not self._hooked:
            self._hooked = True
            for buckets in self.buckets:
                for bucket in buckets:
                    for j, slot in enumerate(bucket.slots):
                        target = slot.autograd_param()
                        if target is not None:
                            target.register_post_accumulate_grad_hook(
                                functools.partial(self._on_grad, bucket, j)
                            )
        self._armed = True

    def _on_grad(self, bucket: _Bucket, j: int, param: torch.Tensor) -> None:
        if not self._armed or bucket.sent:
            return
        bucket.ready.add(j)
        if len(bucket.ready) == len(bucket.slots):
            self._send(bucket)

    @torch.no_grad()
    def after_backward(self, part_index: int = 0) -> None:
        """Take the gradients of the micro-batch just back-propagated through ``part_index``."""
        if self.tied_role == "last" and part_index == self._tied_part:
            self._send_tied()
        for bucket in self.buckets[part_index]:
            if not bucket.sent:
                self._send(bucket)
            bucket.sent, bucket.ready = False, set()
        self._armed = False

    @torch.no_grad()
    def _send(self, bucket: _Bucket) -> None:
        """Take a bucket's gradients of this micro-batch: start their exchange, or add them locally."""
        bucket.sent = True
        grads = [self._take(slot) for slot in bucket.slots]
        for j, g in enumerate(grads):
            bucket.seen[j] = bucket.seen[j] or g is not None
        if self.dp > 1:
            self._exchange(bucket, grads)
            return
        for j, g in enumerate(grads):
            if g is not None:
                acc = bucket.local_acc[j]
                bucket.local_acc[j] = g.clone() if acc is None else acc.add_(g)

    def _take(self, slot: _Slot) -> torch.Tensor | None:
        g = slot.take()
        if slot is self.tied_slot and self.tied_role == "first":
            head = self._recv_tied(g)  # the last stage's use of the same weight
            g = head if g is None else head + g  # as autograd adds the two uses in one process
        return g

    def _peer(self) -> int:
        assert self.tied_group is not None
        return 1 - dist.get_rank(self.tied_group)

    def _send_tied(self) -> None:
        slot = self.tied_slot
        assert slot is not None
        g = slot.take()
        if g is None:
            g = torch.zeros(slot.shape, dtype=slot.param.dtype, device=_device(slot.param))
        buf = g.detach().cpu() if _staged(g, self.tied_group) else g.contiguous()
        work = dist.isend(buf, group=self.tied_group, group_dst=self._peer())
        self._pending.append((work, buf))

    def _recv_tied(self, like: torch.Tensor | None) -> torch.Tensor:
        slot = self.tied_slot
        assert slot is not None
        device = like.device if like is not None else _device(slot.param)
        dtype = like.dtype if like is not None else slot.param.dtype
        staged = device.type == "cuda" and dist.get_backend(self.tied_group) == "gloo"
        buf = torch.empty(slot.shape, dtype=dtype, device="cpu" if staged else device)
        dist.recv(buf, group=self.tied_group, group_src=self._peer())
        return buf.to(device) if staged else buf

    def _exchange(self, bucket: _Bucket, grads: list[torch.Tensor | None]) -> None:
        """Start the all-to-all of one micro-batch's gradients of ``bucket``.

        The exchange in flight (of any bucket) is finished and added first, so one
        bucket's buffers at most are in flight (FSDP2 also keeps one reduction in flight).
        """
        if self._in_flight is not None:
            self._drain(self._in_flight)
        self._in_flight = bucket
        ref = next((g for g in grads if g is not None), None)
        device = ref.device if ref is not None else _device(bucket.slots[0].param)
        dtype = ref.dtype if ref is not None else bucket.slots[0].param.dtype
        full = [
            g if g is not None else torch.zeros(s.shape, dtype=dtype, device=device)
            for s, g in zip(bucket.slots, grads)
        ]
        send = torch.empty(self.dp, bucket.shard_numel, dtype=dtype, device=device)
        # row r: each slot's r-th dim-0 chunk (FSDP2's shard), zero-padded, one after the other
        torch.ops.fsdp.chunk_cat(full, dim=0, num_chunks=self.dp, out=send)
        staged = _staged(send, self.dp_group)
        if staged:
            send = send.cpu()
        recv = torch.empty_like(send)
        work = dist.all_to_all_single(
            recv.view(-1), send.view(-1), group=self.dp_group, async_op=True
        )
        bucket.pending = (work, send, recv, device if staged else None)

    @staticmethod
    def _drain(bucket: _Bucket) -> None:
        """Wait for the bucket's exchange in flight and add its micro-batches in order."""
        if bucket.pending is None:
            return
        work, _, recv, device = bucket.pending
        bucket.pending = None
        work.wait()
        if device is not None:
            recv = recv.to(device)
        for r in range(recv.shape[0]):  # micro-batches i * dp + r, in order
            if bucket.acc is None:
                bucket.acc = recv[r].clone()
            else:
                bucket.acc.add_(recv[r])

    # ------------------------------------------------------------------ the end
    @torch.no_grad()
    def finish(self) -> None:
        """Install the accumulated gradients (after the last micro-batch's backward) and reset."""
        for work, _ in self._pending:
            work.wait()
        self._pending = []
        if self._in_flight is not None:
            self._drain(self._in_flight)
            self._in_flight = None
        self._agree_on_seen()
        tied_piece: torch.Tensor | None = None
        for buckets in self.buckets:
            for bucket in buckets:
                gathered = self._all_gather(bucket) if self.replicate and self.dp > 1 else None
                for j, slot in enumerate(bucket.slots):
                    piece = self._piece(bucket, j, gathered) if bucket.seen[j] else None
                    if piece is not None:
                        slot.install(piece)
                        if slot is self.tied_slot:
                            tied_piece = piece
                bucket.acc = None
                bucket.local_acc = [None] * len(bucket.slots)
                bucket.seen = [False] * len(bucket.slots)
        if self.tied_slot is not None:
            self._share_tied(tied_piece)

    def _agree_on_seen(self) -> None:
        flags = [s for buckets in self.buckets for b in buckets for s in b.seen]
        if self.dp == 1 or not flags:
            return
        t = torch.tensor(flags, dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.dp_group)
        it = iter(bool(v) for v in t.tolist())
        for buckets in self.buckets:
            for b in buckets:
                b.seen = [next(it) for _ in b.slots]

    def _piece(self, bucket: _Bucket, j: int, gathered: torch.Tensor | None) -> torch.Tensor:
        """Slot ``j``'s final local gradient: its shard, or (replicated) its whole local tensor."""
        slot = bucket.slots[j]
        if self.dp == 1:
            acc = bucket.local_acc[j]
            assert acc is not None
            return acc
        assert bucket.acc is not None
        c, off = bucket.chunk_rows[j], bucket.offsets[j]
        width = c * slot.row_numel
        if not self.replicate:
            rank = dist.get_rank(self.dp_group)
            rows = max(0, min(c, slot.rows - rank * c))
            return bucket.acc[off : off + rows * slot.row_numel].view(rows, *slot.shape[1:])
        assert gathered is not None
        full = gathered[:, off : off + width].reshape(self.dp * c, slot.row_numel)[: slot.rows]
        return full.reshape(slot.shape)

    def _all_gather(self, bucket: _Bucket) -> torch.Tensor | None:
        """Every rank's accumulator of ``bucket``, ``[dp, shard_numel]`` (replicated gradients)."""
        acc = bucket.acc
        if acc is None:
            return None
        staged = _staged(acc, self.dp_group)
        src = acc.cpu() if staged else acc
        out = src.new_empty(self.dp, src.numel())
        dist.all_gather_single(out.view(-1), src, group=self.dp_group)
        return out.to(acc.device)

    def _share_tied(self, piece: torch.Tensor | None) -> None:
        """Stage 0 sends the tied gradient it installed to the last stage, which installs it too."""
        slot = self.tied_slot
        assert slot is not None
        if self.tied_role == "first":
            has = torch.tensor([0 if piece is None else 1], dtype=torch.int32)
            dist.send(has, group=self.tied_group, group_dst=self._peer())
            if piece is not None:
                buf = (
                    piece.detach().cpu() if _staged(piece, self.tied_group) else piece.contiguous()
                )
                dist.send(buf, group=self.tied_group, group_dst=self._peer())
            return
        has = torch.zeros(1, dtype=torch.int32)
        dist.recv(has, group=self.tied_group, group_src=self._peer())
        if not int(has.item()):
            return
        shape = self._tied_local_shape()
        device = _device(slot.param)
        staged = device.type == "cuda" and dist.get_backend(self.tied_group) == "gloo"
        buf = torch.empty(shape, dtype=slot.param.dtype, device="cpu" if staged else device)
        dist.recv(buf, group=self.tied_group, group_src=self._peer())
        slot.grad_placements = None  # already resolved on stage 0
        slot.install(buf.to(device) if staged else buf)

    def _tied_local_shape(self) -> tuple[int, ...]:
        slot = self.tied_slot
        assert slot is not None
        if slot.fsdp is not None:
            return tuple(slot.fsdp.sharded_size)
        p = slot.param
        return tuple((p._local_tensor if isinstance(p, DTensor) else p).shape)


def _device(param: torch.Tensor) -> torch.device:
    return (param._local_tensor if isinstance(param, DTensor) else param).device


def _holds(part: nn.Module, param: torch.Tensor) -> bool:
    return any(p is param for p in part.parameters())


def _split(groups: list[list[_Slot]], numel: int) -> list[list[_Slot]]:
    """Each group cut into runs of consecutive slots of at most ``numel`` elements (one slot may exceed it)."""
    out: list[list[_Slot]] = []
    for slots in groups:
        run: list[_Slot] = []
        size = 0
        for slot in slots:
            n = slot.rows * slot.row_numel
            if run and size + n > numel:
                out.append(run)
                run, size = [], 0
            run.append(slot)
            size += n
        if run:
            out.append(run)
    return out


def _leaf_slots(part: nn.Module, slots: list[_Slot]) -> list[_Slot]:
    """``slots`` with each weight whose sequence-chunk leaves sum once per step as one slot per leaf."""
    sums = part.__dict__.get("canonical_step_sums")
    if sums is None or sums.leaves == 1:
        return slots
    out: list[_Slot] = []
    for slot in slots:
        info = slot.fsdp._module_info
        module = info.module
        if not sums.holds(module, info.param_name):
            out.append(slot)
            continue
        sums.reduced = True
        tree = LeafSink(slot.param, sums.leaves)
        sink = functools.partial(sums.sink, module)
        out.extend(_LeafSlot(slot.fsdp, sink, j, tree) for j in range(sums.leaves))
    return out


def _fsdp_groups(part: nn.Module) -> list[list[_Slot]]:
    """The FSDP2 parameter groups of ``part`` (in module order), as slots."""
    groups: list[list[_Slot]] = []
    seen: set[int] = set()
    for module in part.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        for pg in state._fsdp_param_groups:
            if id(pg) in seen:
                continue
            seen.add(id(pg))
            trained = [fp for fp in pg.fsdp_params if fp.sharded_param.requires_grad]
            groups.append([_Slot(fp.sharded_param, fp) for fp in trained])
    return groups
