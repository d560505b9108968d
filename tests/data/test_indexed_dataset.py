"""IndexedDataset / IndexedDatasetBuilder: round trips, modes, merging, atomic writes."""

import os
import pickle
import re
import struct

import numpy as np
import pytest

from epochal.data import IndexedDataset, IndexedDatasetBuilder, write_indexed_dataset
from epochal.data.indexed.indexed_dataset import merge_indexed_datasets
from epochal.data.indexed.indexed_format import (
    DTYPE_CODES,
    HEADER_SIZE,
    exists,
    get_bin_path,
    get_idx_path,
    optimal_dtype,
    read_header,
)

MODES = ["mmap", "cached", "lazy"]
DTYPES = [np.dtype(d) for d in DTYPE_CODES.values()]


def make_documents(seed: int, dtype: np.dtype, count: int = 40) -> list[list[np.ndarray]]:
    """Documents of 0-3 sequences of 0-25 tokens, values spanning the dtype's range."""
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        low, high = -1e6, 1e6
    else:
        info = np.iinfo(dtype)
        low, high = max(info.min, -(2**40)), min(info.max, 2**40)
    documents = []
    for _ in range(count):
        sequences = []
        for _ in range(int(rng.integers(0, 4))):
            values = rng.uniform(low, high, size=int(rng.integers(0, 26)))
            sequences.append(
                values.astype(dtype) if dtype.kind == "f" else np.floor(values).astype(dtype)
            )
        documents.append(sequences)
    return documents


def build(prefix: str, documents: list[list[np.ndarray]], dtype: np.dtype) -> None:
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype)
    for sequences in documents:
        for sequence in sequences:
            builder.add_item(sequence)
        builder.end_document()
    builder.finalize(get_idx_path(prefix))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype_and_mode(tmp_path, dtype):
    documents = make_documents(1, dtype)
    prefix = str(tmp_path / "data")
    build(prefix, documents, dtype)
    flat = [s for d in documents for s in d]
    bounds = np.cumsum([0] + [len(d) for d in documents])
    for mode in MODES:
        with IndexedDataset(prefix, mode=mode) as ds:
            assert ds.dtype == dtype and len(ds) == len(flat)
            assert ds.sequence_lengths.dtype == np.int32 and ds.document_indices.dtype == np.int64
            np.testing.assert_array_equal(ds.document_indices, bounds)
            np.testing.assert_array_equal(ds.sequence_lengths, [len(s) for s in flat])
            for i, expected in enumerate(flat):
                got = ds[i]
                assert isinstance(got, np.ndarray) and got.dtype == dtype
                np.testing.assert_array_equal(got, expected)
            assert ds.num_tokens == sum(len(s) for s in flat)
            assert ds.document_count == len(documents)


@pytest.mark.parametrize("mode", MODES)
def test_slices_get_and_negative_indices(tmp_path, mode):
    sequences = [np.arange(n, dtype=np.int32) + 100 * n for n in (3, 0, 5, 1, 4, 2)]
    prefix = write_indexed_dataset(tmp_path / "s", sequences, dtype=np.int32)
    ds = IndexedDataset(prefix, mode=mode)
    for sl in (
        slice(None),
        slice(1, 4),
        slice(2, 2),
        slice(-3, None),
        slice(0, 6, 2),
        slice(5, 0, -2),
    ):
        got = ds[sl]
        expected = sequences[sl]
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ds[-1], sequences[-1])
    np.testing.assert_array_equal(ds[np.int64(2)], sequences[2])
    np.testing.assert_array_equal(ds.get(2, offset=1, length=3), sequences[2][1:4])
    np.testing.assert_array_equal(ds.get(2, offset=3), sequences[2][3:])
    np.testing.assert_array_equal(ds.get(4), sequences[4])
    assert ds.get(2, offset=5).size == 0
    with pytest.raises(IndexError):
        ds[6]
    with pytest.raises(IndexError):
        ds[-7]
    with pytest.raises(IndexError, match="outside sequence 2"):
        ds.get(2, offset=4, length=2)  # Megatron would read into sequence 3
    with pytest.raises(IndexError):
        ds.get(2, offset=-1)
    with pytest.raises(TypeError):
        ds["0"]
    assert list(map(len, ds)) == [3, 0, 5, 1, 4, 2]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("validate", [True, False])
def test_read_pieces_equals_concatenated_gets(tmp_path, mode, validate):
    sequences = [np.arange(n, dtype=np.uint16) + 100 * n for n in (3, 0, 5, 1, 4, 2)]
    prefix = write_indexed_dataset(tmp_path / "s", sequences, dtype=np.uint16)
    ds = IndexedDataset(prefix, mode=mode, validate=validate)
    out = np.full(20, -7, dtype=np.int64)
    for ids, first, stop in (([2], 1, 4), ([2], 5, 5), ([0, 1, 2, 3], 1, 1), ([4, 2, 5], 0, 2)):
        expected = np.concatenate(
            [ds.get(ids[0], first)] + [ds[i] for i in ids[1:-1]] + [ds.get(ids[-1], 0, stop)]
            if len(ids) > 1
            else [ds.get(ids[0], first, stop - first)]
        )
        written = ds.read_pieces(np.array(ids, dtype=np.int32), first, stop, out)
        assert written == expected.size
        np.testing.assert_array_equal(out[:written], expected)
    for ids, first, stop, match in (
        ([6], 0, 0, "out of range"),
        ([2], 4, 3, "outside sequence 2"),
        ([2, 3], 0, 2, "outside sequence 3"),
        ([2, 4, 4, 4, 4], 0, 4, "out holds 20"),
    ):
        with pytest.raises(IndexError, match=match):
            ds.read_pieces(np.array(ids), first, stop, out)


def test_multimodal_round_trip(tmp_path):
    prefix = str(tmp_path / "mm")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint8, multimodal=True)
    builder.add_item([1, 2], mode=3)
    builder.add_item([4], mode=-1)
    builder.end_document()
    builder.add_document([7, 8, 9], lengths=[1, 2], modes=[5, 6])
    builder.finalize(get_idx_path(prefix))
    ds = IndexedDataset(prefix, multimodal=True)
    tokens, mode = ds[1]
    np.testing.assert_array_equal(tokens, [4])
    assert mode == -1
    sequences, modes = ds[1:4]
    np.testing.assert_array_equal(modes, [-1, 5, 6])
    np.testing.assert_array_equal(sequences[2], [8, 9])
    with pytest.raises(ValueError, match="multimodal=True"):
        IndexedDataset(prefix)
    # modes that do not match the sequences are refused before anything is written
    builder = IndexedDatasetBuilder(str(tmp_path / "mm2.bin"), dtype=np.uint8, multimodal=True)
    with pytest.raises(ValueError, match="1 modes for 2 sequences"):
        builder.add_document([7, 8, 9], lengths=[1, 2], modes=[5])
    with pytest.raises(ValueError, match="int8"):
        builder.add_documents([1, 2], [1, 1], [2], modes=[0, 300])
    builder.add_documents([1, 2], [1, 1], [2], modes=[0, -3])
    builder.finalize()
    assert IndexedDataset(str(tmp_path / "mm2"), multimodal=True)[1][1] == -3


def test_empty_dataset_and_empty_documents(tmp_path):
    prefix = str(tmp_path / "empty")
    with IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint16):
        pass
    for mode in MODES:
        ds = IndexedDataset(prefix, mode=mode)
        assert len(ds) == 0 and ds.document_count == 0 and ds[:] == []
    prefix = str(tmp_path / "docs")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint16)
    builder.add_document([], [])  # Megatron: an empty document has no sequences
    builder.add_document([5, 6], [2])
    builder.add_documents(np.array([1, 2, 3]), [1, 2], [0, 2, 0])
    builder.finalize()
    ds = IndexedDataset(prefix)
    np.testing.assert_array_equal(ds.document_indices, [0, 0, 1, 1, 3, 3])
    np.testing.assert_array_equal(ds[2], [2, 3])


def test_pickle_reopens_in_same_mode(tmp_path):
    prefix = write_indexed_dataset(tmp_path / "p", [[1, 2, 3], [4]], dtype=np.uint16)
    for mode in MODES:
        ds = pickle.loads(pickle.dumps(IndexedDataset(prefix, mode=mode)))
        assert ds.mode == mode
        np.testing.assert_array_equal(ds[0], [1, 2, 3])


def test_builder_accepts_torch_and_rejects_overflow(tmp_path):
    import torch

    builder = IndexedDatasetBuilder(str(tmp_path / "t.bin"), dtype=np.uint16)
    builder.add_item(torch.tensor([1, 65535]))
    builder.add_item(np.array([3.0, 4.0]))
    with pytest.raises(ValueError, match="do not fit uint16"):
        builder.add_item([65536])  # Megatron would silently wrap to 0
    with pytest.raises(ValueError, match="do not fit uint16"):
        builder.add_item([-1])
    with pytest.raises(ValueError, match="non-integer"):
        builder.add_item([1.5])
    with pytest.raises(ValueError, match="do not add up"):
        builder.add_document([1, 2, 3], [2])
    builder.end_document()
    builder.finalize()
    np.testing.assert_array_equal(IndexedDataset(str(tmp_path / "t"))[1], [3, 4])
    with pytest.raises(ValueError, match="already finalized"):
        builder.add_item([1])


def test_builder_writes_atomically(tmp_path):
    prefix = str(tmp_path / "a")
    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.int32)
    builder.add_item([1, 2, 3])
    builder.end_document()
    assert not os.path.exists(get_bin_path(prefix)) and not exists(prefix)
    temporaries = [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert temporaries and all(name.startswith(".a.bin.") for name in temporaries)
    builder.finalize()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx"]

    # an exception inside the context discards everything, and an old pair survives intact
    with (
        pytest.raises(RuntimeError),
        IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.int32) as builder,
    ):
        builder.add_item([9] * 100)
        builder.end_document()
        raise RuntimeError("crash")
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx"]
    np.testing.assert_array_equal(IndexedDataset(prefix)[0], [1, 2, 3])

    builder = IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.int32)
    builder.add_item([1])
    with pytest.raises(ValueError, match="after the last end_document"):
        builder.finalize()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "a.idx"]


def test_builder_spills_index_to_disk(tmp_path, monkeypatch):
    from epochal.data.indexed.spill_array import SpillArray

    original = SpillArray.__init__

    def tiny(self, dtype, directory, tag, limit=1 << 20):
        original(self, dtype, directory, tag, limit=7)

    monkeypatch.setattr(SpillArray, "__init__", tiny)
    sequences = [list(range(i % 5)) for i in range(100)]
    prefix = write_indexed_dataset(tmp_path / "spill", [[s] for s in sequences], dtype=np.uint8)
    ds = IndexedDataset(prefix)
    assert len(ds) == 100 and ds.document_count == 100
    for i in (0, 6, 7, 8, 55, 99):
        np.testing.assert_array_equal(ds[i], sequences[i])
    assert sorted(os.listdir(tmp_path)) == ["spill.bin", "spill.idx"]


def test_builder_lists_read_spilled_index(tmp_path, monkeypatch):
    # Megatron's builder.sequence_lengths / document_indices / sequence_modes, as views
    from epochal.data.indexed.spill_array import SpillArray

    original = SpillArray.__init__
    monkeypatch.setattr(
        SpillArray,
        "__init__",
        lambda self, d, folder, tag, limit=0: original(self, d, folder, tag, 7),
    )
    builder = IndexedDatasetBuilder(tmp_path / "v.bin", dtype=np.uint16, multimodal=True)
    lengths, documents = [], [0]
    for i in range(40):
        builder.add_item(list(range(i % 5)), mode=i % 3)
        lengths.append(i % 5)
        if i % 3 == 2:
            builder.end_document()
            documents.append(i + 1)
        assert builder.sequence_lengths == lengths and builder.document_indices == documents
    assert len(os.listdir(tmp_path)) > 1  # spilled to temporary files
    view = builder.sequence_lengths
    assert view[0] == 0 and view[-1] == 39 % 5 and view[6:9] == lengths[6:9]
    assert view[::7] == lengths[::7] and view[5:2] == [] and list(reversed(view)) == lengths[::-1]
    assert builder.sequence_modes == [i % 3 for i in range(40)]
    np.testing.assert_array_equal(np.asarray(builder.document_indices), documents)
    assert np.asarray(view, dtype=np.int64).dtype == np.int64
    with pytest.raises(IndexError, match="out of range for 40"):
        view[40]
    with pytest.raises(TypeError, match="read-only view; add data with add_item"):
        view.append(3)
    with pytest.raises(TypeError, match="read-only"):
        view[0] = 1
    builder.end_document()
    builder.finalize()
    assert sorted(os.listdir(tmp_path)) == ["v.bin", "v.idx"]  # no spill file left
    assert builder.sequence_lengths == lengths  # still readable, like Megatron's lists
    np.testing.assert_array_equal(
        IndexedDataset(tmp_path / "v", multimodal=True).sequence_lengths, lengths
    )


@pytest.mark.parametrize(
    ("tokens", "pattern"),
    [
        ("1 2 3", "must be integers, got a str"),
        (b"\x01\x02", "must be integers, got a bytes"),
        ([1, None], "must be integers, got NoneType"),
        ([1, "two"], "token 1 is 'two', not a decimal integer"),  # "2" is an id (issue 26)
        ([[1, 2], [3]], "flat or rectangular integer sequence"),
        ([1.5, 2], "non-integer token values"),
        (np.array([1 + 1j]), "must be integers, got values of dtype complex128"),
        ({1: 2}, "must be integers, got a dict"),
        ([2**80], "do not fit uint16"),
        (iter([1, 2]), "must be integers, got list_iterator"),
    ],
)
def test_builder_rejects_non_integer_tokens_clearly(tmp_path, tokens, pattern):
    builder = IndexedDatasetBuilder(tmp_path / "t.bin", dtype=np.uint16)
    for add in (builder.add_item, lambda t: builder.add_document(t, [2])):
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / "t.bin")) + ".*" + pattern):
            add(tokens)
    assert builder.num_tokens == 0 and builder.sequence_lengths == []
    with pytest.raises(ValueError, match="lengths must be integers"):
        builder.add_document([1, 2], [0.5, 1.5])


def test_builder_takes_torch_tensors_of_any_dtype_and_device(tmp_path):
    import torch

    builder = IndexedDatasetBuilder(tmp_path / "t.bin", dtype=np.int32)
    builder.add_item(torch.tensor([3.0, 4.0], dtype=torch.bfloat16, requires_grad=True))
    builder.add_item(torch.tensor([5, 6], dtype=torch.uint16))
    builder.add_item(torch.empty(0, dtype=torch.int64))
    with pytest.raises(ValueError, match="non-integer"):
        builder.add_item(torch.tensor([1.5], dtype=torch.bfloat16))
    builder.end_document()
    builder.finalize()
    assert [x.tolist() for x in IndexedDataset(tmp_path / "t")] == [[3, 4], [5, 6], []]


def test_add_index_merges_and_converts_dtypes(tmp_path):
    a = write_indexed_dataset(tmp_path / "a", [[1, 2], [[3], [4, 5]]], dtype=np.uint16)
    b = write_indexed_dataset(tmp_path / "b", [[70000], []], dtype=np.int32)
    c = write_indexed_dataset(tmp_path / "c", [[6]], dtype=np.uint8)
    merged = merge_indexed_datasets([a, b, c], tmp_path / "m")
    assert merged.dtype == np.int32
    np.testing.assert_array_equal(merged.document_indices, [0, 1, 3, 4, 5, 6])
    assert [x.tolist() for x in merged] == [[1, 2], [3], [4, 5], [70000], [], [6]]
    with pytest.raises(ValueError, match="do not fit uint16"):
        merge_indexed_datasets([a, b], tmp_path / "bad", dtype=np.uint16)
    assert not exists(tmp_path / "bad")
    # a failed add_index leaves no half-merged builder to finalize
    builder = IndexedDatasetBuilder(str(tmp_path / "half.bin"), dtype=np.uint16)
    builder.add_index(a)
    with pytest.raises(ValueError, match="do not fit uint16"):
        builder.add_index(b)
    with pytest.raises(ValueError, match="aborted"):
        builder.finalize()
    assert not exists(tmp_path / "half") and not list(tmp_path.glob(".half*"))
    # merging into one of the inputs is safe: the output is renamed into place at the end
    merge_indexed_datasets([a, c], a)
    assert [x.tolist() for x in IndexedDataset(a)] == [[1, 2], [3], [4, 5], [6]]


def test_header_and_dtype_choice(tmp_path):
    prefix = write_indexed_dataset(tmp_path / "h", [[1]], dtype="uint16")
    header = read_header(get_idx_path(prefix))
    assert (header.dtype, header.sequence_count, header.document_count) == (np.uint16, 1, 2)
    assert os.path.getsize(get_idx_path(prefix)) == HEADER_SIZE + 4 + 8 + 16
    assert optimal_dtype(50257) == np.uint16 and optimal_dtype(65499) == np.uint16
    assert optimal_dtype(65500) == np.int32 and optimal_dtype(None) == np.int32
    with pytest.raises(ValueError, match="not supported"):
        IndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.uint32)
    with open(get_idx_path(prefix), "rb") as stream:
        assert stream.read(9) == b"MMIDIDX\x00\x00" and struct.unpack("<Q", stream.read(8)) == (1,)
    with pytest.raises(ValueError, match="mode="):
        IndexedDataset(prefix, mode="fast")
    assert IndexedDataset(prefix, mmap=False).mode == "lazy"  # Megatron-Core's keyword
    assert IndexedDataset(prefix, mode="cached", mmap=True).mode == "mmap"
