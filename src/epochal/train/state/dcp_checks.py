"""Check a DCP folder's metadata against its files before any tensor is allocated or read.

``.metadata`` (PyTorch DCP: an epochal step folder, a Megatron ``torch_dist`` folder,
NeMo 2's ``weights/``) declares every tensor's global shape, the chunks that cover it
and, for each chunk, the file, byte offset and byte length where it is stored. Nothing
of that is trusted; :func:`check_dcp_metadata` refuses, naming the file:

- a storage reference (``relative_path``) that is absolute, holds ``..`` or leaves the
  folder through a link (checked before any shard is opened), a missing shard file;
- a negative, non-integer or overflowing shape (more than :data:`MAX_TENSOR_BYTES`);
- chunks that do not cover their tensor exactly: out of bounds, overlapping, or leaving
  elements uncovered (DCP would hand back uninitialized memory for those);
- a chunk whose stored bytes are fewer than its elements need, or a file shorter than
  the offsets and lengths in the metadata (``truncated``, with the expected and
  actual sizes).

So a tensor is only ever allocated when the bytes for all of it are present.
:func:`read_per_file` then reads one shard file at a time so that a damaged file
(zeroed, overwritten) is named in the error instead of DCP's ``CheckpointException``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from epochal._paths import UnsafePathError, confined_path
from epochal.train.state.errors import CheckpointCorruptError, CheckpointError

__all__ = ["MAX_TENSOR_BYTES", "check_dcp_metadata", "dcp_failure", "read_per_file"]

#: the largest single tensor a DCP folder may declare (bytes): 2**50, 1 PiB.
MAX_TENSOR_BYTES = 1 << 50
#: a saved tensor record (``torch.save``'s zip format) begins with a zip local header.
_ZIP_MAGIC = b"PK\x03\x04"


def _int_tuple(value: Any) -> tuple[int, ...] | None:
    try:
        items = tuple(value)
    except TypeError:
        return None
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        return items
    return None


def _volume(sizes: tuple[int, ...]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def check_dcp_metadata(metadata: Metadata, folder: Path, source: str) -> None:
    """Refuse metadata that does not describe ``folder``'s files exactly (see the module).

    Args:
        metadata: the unpickled ``.metadata``.
        folder: the checkpoint folder its references are relative to.
        source: the ``.metadata`` path, for messages.

    Raises:
        CheckpointError: a bad shape, a reference outside the folder, chunks that do not
            cover a tensor exactly, a missing shard file.
        CheckpointCorruptError: a shard file shorter than the metadata says (truncated).
    """
    declared = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(declared, Mapping):
        raise CheckpointError(f"{source}: no state_dict_metadata mapping")
    if storage is None:
        storage = {}
    if not isinstance(storage, Mapping):
        raise CheckpointError(f"{source}: storage_data is not a mapping")
    sizes = _storage_files(storage, folder, source)
    for fqn, meta in declared.items():
        if isinstance(meta, TensorStorageMetadata):
            _check_tensor(str(fqn), meta, storage, source)
        elif not isinstance(meta, BytesStorageMetadata):
            raise CheckpointError(f"{source}: {fqn!r} has unknown metadata {type(meta).__name__}")
    for info in storage.values():
        path = info.relative_path
        end = info.offset + info.length
        if end > sizes[path]:
            raise CheckpointCorruptError(
                f"{folder / path}: truncated: the metadata places {info.length} bytes at offset "
                f"{info.offset} (the file must be at least {end} bytes), but it has {sizes[path]}"
            )


def _storage_files(storage: Mapping[Any, Any], folder: Path, source: str) -> dict[str, int]:
    """Check every storage entry's reference and numbers; the referenced files' sizes."""
    sizes: dict[str, int] = {}
    missing: list[str] = []
    for key, info in storage.items():
        if not isinstance(key, MetadataIndex):
            raise CheckpointError(f"{source}: storage key {key!r} is not a DCP MetadataIndex")
        path = getattr(info, "relative_path", None)
        try:
            full = confined_path(folder, path, source)
        except UnsafePathError as exc:
            raise CheckpointError(str(exc)) from None
        for field in ("offset", "length"):
            value = getattr(info, field, None)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CheckpointError(
                    f"{source}: storage of {key.fqn!r} has {field}={value!r} (must be an "
                    "integer >= 0)"
                )
        if path not in sizes:
            try:
                sizes[path] = full.stat().st_size
            except FileNotFoundError:
                sizes[path] = 0
                missing.append(path)
            except OSError as exc:
                raise CheckpointError(f"{full}: unreadable shard file ({exc})") from exc
    if missing:
        raise CheckpointCorruptError(
            f"{folder}: shard files are missing: {sorted(missing)[:8]} (named by {source})"
        )
    return sizes


def _check_tensor(
    fqn: str, meta: TensorStorageMetadata, storage: Mapping[Any, Any], source: str
) -> None:
    shape = _int_tuple(meta.size)
    if shape is None:
        raise CheckpointError(
            f"{source}: {fqn!r} declares shape {tuple(meta.size)!r} (sizes must be integers >= 0)"
        )
    dtype = getattr(meta.properties, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{source}: {fqn!r} has no valid dtype ({dtype!r})")
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = _volume(shape)
    if numel * itemsize > MAX_TENSOR_BYTES:
        raise CheckpointError(
            f"{source}: {fqn!r} declares shape {shape} ({numel * itemsize} bytes), over the "
            f"{MAX_TENSOR_BYTES}-byte limit for one tensor"
        )
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    for chunk in meta.chunks:
        offsets, lengths = _int_tuple(chunk.offsets), _int_tuple(chunk.sizes)
        if (
            offsets is None
            or lengths is None
            or len(offsets) != len(shape)
            or len(lengths) != len(shape)
            or any(o + n > s for o, n, s in zip(offsets, lengths, shape, strict=True))
        ):
            raise CheckpointError(
                f"{source}: {fqn!r} has a chunk at {tuple(chunk.offsets)} of "
                f"{tuple(chunk.sizes)} outside its shape {shape}"
            )
        info = storage.get(MetadataIndex(fqn, torch.Size(offsets)))
        if info is None:
            raise CheckpointError(f"{source}: {fqn!r} chunk at {offsets} has no storage entry")
        need = _volume(lengths) * itemsize
        if not getattr(info, "transform_descriptors", None) and info.length < need:
            raise CheckpointError(
                f"{source}: {fqn!r} chunk at {offsets} of {lengths} needs {need} bytes, its "
                f"storage entry holds {info.length}"
            )
        boxes.append((offsets, lengths))
    _check_cover(fqn, shape, numel, boxes, source)


def _check_cover(
    fqn: str,
    shape: tuple[int, ...],
    numel: int,
    boxes: list[tuple[tuple[int, ...], tuple[int, ...]]],
    source: str,
) -> None:
    """The chunks' boxes are pairwise disjoint and their volumes sum to the tensor's."""
    total = sum(_volume(n) for _, n in boxes)
    boxes = [b for b in boxes if _volume(b[1]) > 0]
    if len(boxes) > 1 and shape:
        starts = torch.tensor([o for o, _ in boxes], dtype=torch.float64)
        ends = starts + torch.tensor([n for _, n in boxes], dtype=torch.float64)
        for i in range(len(boxes) - 1):  # row i against the later rows: O(n^2) comparisons
            apart = (starts[i] >= ends[i + 1 :]) | (starts[i + 1 :] >= ends[i])
            hit = (~apart.any(dim=1)).nonzero()
            if hit.numel():
                j = i + 1 + int(hit[0, 0])
                raise CheckpointError(
                    f"{source}: {fqn!r} has overlapping chunks at {boxes[i][0]} and {boxes[j][0]}"
                )
    if total != numel:
        raise CheckpointError(
            f"{source}: the chunks of {fqn!r} cover {total} of the {numel} elements of its "
            f"declared shape {shape}; refusing to read a partly uninitialized tensor"
        )


def read_per_file(
    plan: Any, storage: Mapping[Any, Any], folder: Path, read: Callable[[Any], Any]
) -> Any:
    """Run DCP's ``read(plan)`` once per shard file; errors name the file.

    Before a file is read, each tensor item's bytes must begin with a saved-tensor
    record (a zeroed or overwritten file is refused as such).

    Raises:
        CheckpointCorruptError: a file whose items cannot be read, naming it.
    """
    per_file: dict[str, list[Any]] = {}
    for item in plan.items:
        per_file.setdefault(storage[item.storage_index].relative_path, []).append(item)
    result = None
    for relative, items in per_file.items():
        path = folder / relative
        _check_records(path, [storage[i.storage_index] for i in items if _is_tensor(i)])
        try:
            result = read(dataclasses.replace(plan, items=items))
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure here is a damaged file
            raise CheckpointCorruptError(
                f"{path}: damaged shard file ({type(exc).__name__}: {exc})"
            ) from exc
    if result is None:
        result = read(plan)  # an empty plan: DCP's own result
    return result


def _is_tensor(item: Any) -> bool:
    return getattr(getattr(item, "type", None), "name", "") != "BYTE_IO"


def _check_records(path: Path, infos: list[Any]) -> None:
    infos = [i for i in infos if not getattr(i, "transform_descriptors", None)]
    if not infos:
        return
    with open(path, "rb") as f:
        for info in infos:
            f.seek(info.offset)
            head = f.read(len(_ZIP_MAGIC))
            if head != _ZIP_MAGIC:
                raise CheckpointCorruptError(
                    f"{path}: damaged shard file: no saved tensor at offset {info.offset} "
                    f"(found {head!r}; zeroed or overwritten?)"
                )


def dcp_failure(exc: BaseException) -> BaseException:
    """The error under DCP's ``CheckpointException`` (a :class:`CheckpointError` first), else ``exc``.

    DCP wraps every rank's reader error in a ``CheckpointException`` whose text is a
    traceback; this returns the underlying exception so that its message can be shown.
    """
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, Mapping) or not failures:
        return exc
    causes = [p[0] for p in failures.values() if isinstance(p, tuple) and p]
    for cause in causes:
        if isinstance(cause, CheckpointError):
            return cause
    return causes[0] if causes else exc
