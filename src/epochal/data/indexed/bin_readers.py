"""Readers of the token data (``.bin``) file, one per ``IndexedDataset`` mode.

Each reader returns the tokens between two token offsets as a 1-D numpy array.
Bounds are checked by :class:`~epochal.data.indexed_dataset.IndexedDataset` against
the validated index; the readers check again only what a file read can add
(a file that shrank after it was opened).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from epochal.data.indexed.indexed_format import IndexedFileError


def map_file(path: str) -> np.ndarray:
    """Map a whole file read-only; return a plain uint8 ndarray over it (empty file: empty array)."""
    with open(path, "rb") as stream:
        if os.fstat(stream.fileno()).st_size == 0:  # mmap cannot map an empty file
            return np.empty(0, dtype=np.uint8)
        mapping = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapping, dtype=np.uint8)


class MMapTokenReader:
    """Maps the ``.bin`` file; reads are zero-copy, read-only views.

    Args:
        bin_path: the ``.bin`` file.
        dtype: token dtype.
    """

    def __init__(self, bin_path: str, dtype: np.dtype) -> None:
        self.bin_path = bin_path
        self._tokens = map_file(bin_path).view(dtype)

    @property
    def tokens(self) -> np.ndarray:
        """The whole token array (read-only view of the mapping)."""
        return self._tokens

    def read(self, start: int, stop: int) -> np.ndarray:
        """Return tokens ``[start, stop)`` (token offsets), shape ``(stop - start,)``."""
        return self._tokens[start:stop]

    def close(self) -> None:
        """Drop the mapping (it is unmapped once no returned view is alive)."""
        self._tokens = np.empty(0, dtype=self._tokens.dtype)


class CachedTokenReader:
    """Reads the whole ``.bin`` file into memory once; reads are read-only views.

    Args:
        bin_path: the ``.bin`` file.
        dtype: token dtype.
    """

    def __init__(self, bin_path: str, dtype: np.dtype) -> None:
        self.bin_path = bin_path
        self._tokens = np.fromfile(bin_path, dtype=dtype)
        self._tokens.flags.writeable = False

    @property
    def tokens(self) -> np.ndarray:
        """The whole token array (read-only, in memory)."""
        return self._tokens

    def read(self, start: int, stop: int) -> np.ndarray:
        """Return tokens ``[start, stop)`` (token offsets), shape ``(stop - start,)``."""
        return self._tokens[start:stop]

    def close(self) -> None:
        """Free the cached tokens."""
        self._tokens = np.empty(0, dtype=self._tokens.dtype)


class FileTokenReader:
    """Reads with positional file reads (``pread``), no mmap; each read is a new array.

    For filesystems where mmap is slow or unsupported (some network filesystems).
    ``pread`` does not move a shared file offset, so one descriptor serves threads
    and forked workers alike.

    Args:
        bin_path: the ``.bin`` file.
        dtype: token dtype.
    """

    def __init__(self, bin_path: str, dtype: np.dtype) -> None:
        self.bin_path = bin_path
        self._dtype = dtype
        self._itemsize = dtype.itemsize
        self._fd: int | None = os.open(bin_path, os.O_RDONLY)

    #: No whole-file array: reads go through ``pread``.
    tokens = None

    def read(self, start: int, stop: int) -> np.ndarray:
        """Return tokens ``[start, stop)`` (token offsets), shape ``(stop - start,)``.

        Raises:
            IndexedFileError: the file ended before the requested bytes.
            ValueError: the reader was closed.
        """
        if self._fd is None:
            raise ValueError(f"{self.bin_path}: dataset is closed")
        count = stop - start
        out = np.empty(count, dtype=self._dtype)
        if count == 0:
            return out
        nbytes = count * self._itemsize
        offset = start * self._itemsize
        view = memoryview(out).cast("B")
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                raise IndexedFileError(
                    f"{self.bin_path}: file ended at byte {offset + done}, index needs {offset + nbytes}"
                )
            done += got
        return out

    def close(self) -> None:
        """Close the file descriptor."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()


READERS = {"mmap": MMapTokenReader, "cached": CachedTokenReader, "lazy": FileTokenReader}
