"""Megatron's indexed dataset (``.bin`` + ``.idx``): reader and builder (one import for both).

Files written here are read by Megatron-Core's ``IndexedDataset`` and files it
writes are read here, sequence for sequence (see :mod:`epochal.data.indexed.indexed_format`
for the layout). Differences from Megatron-Core, all on the side of safety:

- Opening validates the pair (magic, version, dtype code, sizes, every pointer and
  document boundary) and raises :class:`IndexedFileError` naming the file, where
  Megatron asserts or returns wrong tokens.
- ``mode="lazy"`` reads with ``pread`` (no mmap) and ``mode="cached"`` holds both
  files in memory; Megatron has only mmap or per-read ``open``.
- The builder writes to temporary names and renames on :meth:`IndexedDatasetBuilder.finalize`,
  keeps its index in bounded memory (spilling to disk) and rejects token ids that
  do not fit its dtype instead of wrapping them.

The reader is :mod:`epochal.data.indexed.indexed_reader`, the builder
:mod:`epochal.data.indexed.indexed_builder`; both are re-exported here.
"""

from epochal.data.indexed.indexed_builder import (
    IndexedDatasetBuilder,
    merge_indexed_datasets,
    write_indexed_dataset,
)
from epochal.data.indexed.indexed_format import (
    IndexedFileError,
    exists,
    get_bin_path,
    get_idx_path,
    optimal_dtype,
)
from epochal.data.indexed.indexed_reader import IndexedDataset
from epochal.data.indexed.token_arrays import _as_token_array as _as_token_array

__all__ = [
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "IndexedFileError",
    "exists",
    "get_bin_path",
    "get_idx_path",
    "merge_indexed_datasets",
    "optimal_dtype",
    "write_indexed_dataset",
]
