"""Malformed .bin/.idx pairs: each gives a clear error naming the file, never a crash or wrong data."""

import os
import re
import struct

import numpy as np
import pytest

from epochal.data import IndexedDataset, IndexedFileError, write_indexed_dataset
from epochal.data.indexed.indexed_format import HEADER_SIZE, get_bin_path, get_idx_path

MODES = ["mmap", "cached", "lazy"]
SEQUENCES = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]  # 4 sequences, 4 documents, uint16


@pytest.fixture
def prefix(tmp_path):
    return write_indexed_dataset(tmp_path / "c", [[s] for s in SEQUENCES], dtype=np.uint16)


def patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(data)


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as stream:
        stream.truncate(size)


# offsets inside the .idx of the fixture (N = 4 sequences, D = 5 document entries)
LENGTHS = HEADER_SIZE
POINTERS = LENGTHS + 4 * 4
DOCUMENTS = POINTERS + 8 * 4


def expect_error(prefix: str, path: str, pattern: str, error=IndexedFileError, **kwargs) -> None:
    for mode in MODES:
        with pytest.raises(error, match=re.escape(path) + ".*" + pattern):
            IndexedDataset(prefix, mode=mode, **kwargs)


def test_wrong_magic(prefix):
    patch(get_idx_path(prefix), 0, b"XXXXXXX")
    expect_error(prefix, get_idx_path(prefix), "not a Megatron indexed dataset")


def test_unknown_version(prefix):
    patch(get_idx_path(prefix), 9, struct.pack("<Q", 2))
    expect_error(prefix, get_idx_path(prefix), "unsupported index version 2")


def test_unknown_dtype_code(prefix):
    patch(get_idx_path(prefix), 17, struct.pack("<B", 9))
    expect_error(prefix, get_idx_path(prefix), "unknown dtype code 9")


@pytest.mark.parametrize("size", [0, 5, 20, HEADER_SIZE, DOCUMENTS + 3])
def test_truncated_index(prefix, size):
    truncate(get_idx_path(prefix), size)
    expect_error(prefix, get_idx_path(prefix), "truncated index")


def test_index_longer_than_header_says(prefix):
    with open(get_idx_path(prefix), "ab") as stream:
        stream.write(b"\x00" * 3)
    expect_error(prefix, get_idx_path(prefix), "header promises")


def test_index_points_past_end_of_bin(prefix):
    truncate(get_bin_path(prefix), 2 * 8)  # 8 of 10 tokens
    expect_error(
        prefix, get_idx_path(prefix), "points past the end of " + re.escape(get_bin_path(prefix))
    )


def test_bin_longer_than_index(prefix):
    with open(get_bin_path(prefix), "ab") as stream:
        stream.write(b"\x00\x00")
    expect_error(prefix, get_bin_path(prefix), "trailing bytes")


def test_bin_size_not_multiple_of_token_size(prefix):
    with open(get_bin_path(prefix), "ab") as stream:
        stream.write(b"\x00")
    expect_error(prefix, get_bin_path(prefix), "not a multiple")


def test_corrupt_pointer(prefix):
    patch(get_idx_path(prefix), POINTERS + 8 * 2, struct.pack("<q", 2))
    expect_error(prefix, get_idx_path(prefix), "sequence 2 starts at byte 2, expected 10")


def test_negative_length(prefix):
    patch(get_idx_path(prefix), LENGTHS + 4, struct.pack("<i", -2))
    expect_error(prefix, get_idx_path(prefix), "negative length")


@pytest.mark.parametrize(
    ("entry", "value", "pattern"),
    [
        (0, 1, "must start with 0"),
        (4, 3, "last document ends at sequence 3"),
        (2, 5, "decrease at entry 3"),
    ],
)
def test_corrupt_document_indices(prefix, entry, value, pattern):
    patch(get_idx_path(prefix), DOCUMENTS + 8 * entry, struct.pack("<q", value))
    expect_error(prefix, get_idx_path(prefix), pattern)


def test_missing_files(prefix):
    os.remove(get_bin_path(prefix))
    expect_error(prefix, get_bin_path(prefix), "not found", error=FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="nowhere.idx"):
        IndexedDataset(os.path.join(os.path.dirname(prefix), "nowhere"))


def test_reads_are_bounds_checked_without_full_validation(prefix):
    # validate=False skips the O(N) scan; a corrupt middle pointer is still caught on read
    patch(get_idx_path(prefix), POINTERS + 8 * 1, struct.pack("<q", 1 << 40))
    for mode in MODES:
        ds = IndexedDataset(prefix, mode=mode, validate=False)
        np.testing.assert_array_equal(ds[0], [1, 2, 3])
        with pytest.raises(IndexedFileError, match="sequence 1 points past the end of"):
            ds[1]


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        (LENGTHS + 4, struct.pack("<i", -1), "sequence 1 has negative length -1"),
        (POINTERS + 8, struct.pack("<q", 7), "sequence 1 starts at byte 7, not a multiple of 2"),
    ],
)
def test_unvalidated_reads_reject_a_bad_entry(prefix, field, value, pattern):
    patch(get_idx_path(prefix), field, value)
    for mode in MODES:
        ds = IndexedDataset(prefix, mode=mode, validate=False)
        with pytest.raises(
            IndexedFileError, match=re.escape(get_idx_path(prefix)) + ".*" + pattern
        ):
            ds[1]


def test_lazy_mode_detects_a_file_that_shrank(prefix):
    ds = IndexedDataset(prefix, mode="lazy")
    truncate(get_bin_path(prefix), 6)
    np.testing.assert_array_equal(ds[0], [1, 2, 3])
    with pytest.raises(IndexedFileError, match=re.escape(get_bin_path(prefix)) + ".*file ended"):
        ds[1]
