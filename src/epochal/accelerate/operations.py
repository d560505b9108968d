"""Collectives over all processes: ``gather``, ``reduce``, ``pad_across_processes``, ``broadcast``.

Accelerate's semantics on nested structures (dicts, lists, tuples of tensors):
``gather`` concatenates every process's tensors along dim 0 in rank order (0-d
tensors become ``[1]``), ``reduce`` sums (or averages) them. In one process they
return their input. Tensors are moved to ``device`` for the collective (NCCL
needs CUDA tensors) and come back there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["broadcast_object", "gather", "gather_object", "pad_across_processes", "reduce"]


def _apply(fn: Callable[[torch.Tensor], torch.Tensor], data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, Mapping):
        return type(data)({k: _apply(fn, v) for k, v in data.items()})
    if isinstance(data, (list, tuple)):
        return type(data)(_apply(fn, v) for v in data)
    raise TypeError(
        f"expected tensors (or dicts / lists / tuples of them), got {type(data).__name__}"
    )


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def gather(data: Any, device: torch.device, ranks: list[int] | None = None) -> Any:
    """Every process's tensors concatenated along dim 0, by rank (see the module docstring).

    ``ranks``: keep only those processes' parts (all processes still take part).

    Raises:
        ValueError: the processes' tensors differ beyond dim 0 (pad them first:
            :func:`pad_across_processes`).
    """
    if _world() == 1:
        return _apply(lambda t: t if t.dim() else t.reshape(1), data)

    def one(t: torch.Tensor) -> torch.Tensor:
        t = (t if t.dim() else t.reshape(1)).to(device).contiguous()
        shape = torch.tensor(list(t.shape), device=device)
        shapes = [torch.empty_like(shape) for _ in range(_world())]
        dist.all_gather(shapes, shape)
        if any(not torch.equal(s[1:], shape[1:]) for s in shapes):
            raise ValueError(
                f"gather: the processes' tensors differ beyond dim 0 ({[s.tolist() for s in shapes]}); "
                "pad them with accelerator.pad_across_processes first"
            )
        longest = int(max(int(s[0]) for s in shapes))
        padded = t.new_zeros((longest, *t.shape[1:]))
        padded[: t.shape[0]] = t
        parts = [torch.empty_like(padded) for _ in range(_world())]
        dist.all_gather(parts, padded)
        kept = [
            p[: int(s[0])]
            for rank, (p, s) in enumerate(zip(parts, shapes))
            if ranks is None or rank in ranks
        ]
        return torch.cat(kept)

    return _apply(one, data)


def gather_object(obj: Any) -> list[Any]:
    """Every process's picklable ``obj``, by rank (a list; items of list objects flattened)."""
    if _world() == 1:
        return list(obj) if isinstance(obj, list) else [obj]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, obj)
    if all(isinstance(o, list) for o in out):
        return [x for o in out for x in o]
    return out


def reduce(data: Any, device: torch.device, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Sum (``"sum"``), average (``"mean"``) or keep (``"none"``) tensors over processes, times ``scale``.

    Raises:
        ValueError: an unknown ``reduction``.
    """
    if reduction not in ("sum", "mean", "none"):
        raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}")

    def one(t: torch.Tensor) -> torch.Tensor:
        out = t.clone().to(device)
        if reduction != "none" and _world() > 1:
            dist.all_reduce(out)
            if reduction == "mean":
                out = out / _world()
        return out * scale if scale != 1.0 else out

    return _apply(one, data)


def pad_across_processes(
    data: Any, device: torch.device, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad tensors along ``dim`` to the longest over processes (with ``pad_index``)."""

    def one(t: torch.Tensor) -> torch.Tensor:
        if _world() == 1 or t.dim() == 0:
            return t
        size = torch.tensor([t.shape[dim]], device=device)
        dist.all_reduce(size, op=dist.ReduceOp.MAX)
        longest = int(size.item())
        if longest == t.shape[dim]:
            return t
        shape = list(t.shape)
        shape[dim] = longest - t.shape[dim]
        pad = t.new_full(shape, pad_index)
        return torch.cat([pad, t] if pad_first else [t, pad], dim=dim)

    return _apply(one, data)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Global rank ``src``'s picklable ``obj`` on every process."""
    if _world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
