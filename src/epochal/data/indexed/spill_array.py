"""An append-only 1-D array in bounded memory, and a read-only list view of it.

:class:`SpillArray` keeps up to ``limit`` items in one in-memory buffer and appends
the rest to a hidden temporary file, so the builder's index (lengths, document
indices, modes) never grows in memory with the corpus. :class:`SpillArrayView` shows
it the way Megatron-Core's builder shows its Python lists (``builder.sequence_lengths``
and friends): ``len``, indexing (Python ints), slicing (lists), iteration,
comparison with lists and ``numpy.asarray``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["CHUNK", "SpillArray", "SpillArrayView", "temp_name"]

CHUNK = 1 << 20  # items per in-memory buffer and per chunk read back


def temp_name(directory: str, base: str) -> str:
    """Return a fresh hidden temporary path ``directory/.base.<random>.tmp`` (opened with mode ``x``)."""
    return os.path.join(directory, f".{base}.{uuid.uuid4().hex[:12]}.tmp")


class SpillArray:
    """An append-only 1-D array kept in memory up to ``limit`` items, then spilled to a temp file.

    Args:
        dtype: item dtype.
        directory: folder of the spill file (created on the first spill, removed by
            :meth:`discard`).
        tag: part of the spill file's name.
        limit: items held in memory at most.
    """

    def __init__(self, dtype: Any, directory: str, tag: str, limit: int = CHUNK) -> None:
        self.dtype = np.dtype(dtype)
        self._directory = directory
        self._tag = tag
        self._limit = limit
        self._buffer = np.empty(0, dtype=self.dtype)  # grows by doubling up to limit
        self._buffered = 0
        self._spilled = 0
        self._file: Any = None
        self._path: str | None = None

    def __len__(self) -> int:
        return self._spilled + self._buffered

    def extend(self, values: Any) -> None:
        """Append ``values`` (converted to the dtype, flattened)."""
        values = np.asarray(values, dtype=self.dtype).reshape(-1)
        while values.size:
            if self._buffered == self._limit:
                self._spill()
            take = values[: self._limit - self._buffered]
            need = self._buffered + take.size
            if need > self._buffer.size:
                grown = np.empty(
                    min(self._limit, max(need, 2 * self._buffer.size, 256)), self.dtype
                )
                grown[: self._buffered] = self._buffer[: self._buffered]
                self._buffer = grown
            self._buffer[self._buffered : need] = take
            self._buffered = need
            values = values[take.size :]

    def append(self, value: int) -> None:
        """Append one item."""
        self.extend(np.array([value], dtype=self.dtype))

    def _spill(self) -> None:
        if self._file is None:
            self._path = temp_name(self._directory, self._tag)
            self._file = open(self._path, "x+b")  # closed by discard()
        self._file.seek(0, os.SEEK_END)  # chunks() may have moved the position
        self._file.write(self._buffer[: self._buffered].tobytes())
        self._spilled += self._buffered
        self._buffered = 0

    def chunks(self, size: int = CHUNK) -> Iterator[np.ndarray]:
        """Yield the contents in order, in arrays of at most ``size`` items."""
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            remaining = self._spilled
            while remaining:
                count = min(size, remaining)
                yield np.frombuffer(self._file.read(count * self.dtype.itemsize), dtype=self.dtype)
                remaining -= count
        for start in range(0, self._buffered, size):
            yield self._buffer[start : min(start + size, self._buffered)]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` as a new array (``0 <= start <= stop <= len(self)``)."""
        parts = []
        if start < self._spilled:
            end = min(stop, self._spilled)
            self._file.flush()
            itemsize = self.dtype.itemsize
            raw = os.pread(self._file.fileno(), (end - start) * itemsize, start * itemsize)
            parts.append(np.frombuffer(raw, dtype=self.dtype))
        if stop > self._spilled:
            low = max(start, self._spilled) - self._spilled
            parts.append(self._buffer[low : stop - self._spilled].copy())
        return (
            np.concatenate(parts)
            if len(parts) > 1
            else (parts[0] if parts else np.empty(0, self.dtype))
        )

    def unlink(self) -> None:
        """Remove the spill file's name; the items stay readable through the open handle."""
        if self._path is not None:
            try:
                os.remove(self._path)
            except FileNotFoundError:
                pass
            self._path = None

    def __del__(self) -> None:
        file = getattr(self, "_file", None)
        if file is not None:
            file.close()

    def discard(self) -> None:
        """Drop every item and remove the spill file."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            try:
                os.remove(self._path)
            except FileNotFoundError:
                pass
            self._path = None
        self._buffer, self._buffered, self._spilled = np.empty(0, dtype=self.dtype), 0, 0


class SpillArrayView(Sequence):
    """Read-only, list-like view of a :class:`SpillArray` (Megatron's builder lists).

    ``view[i]`` is a Python ``int`` (negative indices count from the end), ``view[a:b]``
    a ``list``, ``view == [..]`` compares with any sequence, ``numpy.asarray(view)``
    gives the array. It follows the builder: items added later show up. Changing it
    (``append``, ``extend``, item assignment) raises ``TypeError``: add tokens through
    the builder's methods, which keep the ``.bin`` and the index in step.
    """

    def __init__(self, array: SpillArray, name: str) -> None:
        self._array = array
        self._name = name

    def __len__(self) -> int:
        return len(self._array)

    def __getitem__(self, index: Any) -> Any:
        n = len(self._array)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                return self._array.read(start, max(start, stop)).tolist()
            return [self[i] for i in range(start, stop, step)]
        try:
            i = int(index.__index__())
        except AttributeError:
            raise TypeError(
                f"{self._name} indices must be integers or slices, not {type(index).__name__}"
            ) from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{self._name} index {int(index)} out of range for {n} items")
        return int(self._array.read(i, i + 1)[0])

    def __iter__(self) -> Iterator[int]:
        for chunk in self._array.chunks():
            yield from chunk.tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = np.concatenate([np.empty(0, self._array.dtype), *self._array.chunks()])
        return array if dtype is None else array.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SpillArrayView):
            other = list(other)
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable contents, like a list

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError(
            f"builder.{self._name} is a read-only view; add data with add_item / add_document / "
            "end_document, which keep the .bin and the index in step"
        )

    append = extend = insert = pop = remove = clear = __setitem__ = __delitem__ = __iadd__ = (
        _read_only
    )

    def __repr__(self) -> str:
        n = len(self)
        items = ", ".join(map(str, self[:10])) + (", ..." if n > 10 else "")
        return f"[{items}]"
