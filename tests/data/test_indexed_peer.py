"""Peer tests against the real megatron-core IndexedDataset / IndexedDatasetBuilder, both directions."""

import warnings

import numpy as np
import pytest

from epochal.data import IndexedDataset, IndexedDatasetBuilder
from epochal.data.indexed.indexed_dataset import merge_indexed_datasets
from epochal.data.indexed.indexed_format import DTYPE_CODES, get_bin_path, get_idx_path

pytestmark = pytest.mark.peer

DTYPES = [np.dtype(d) for d in DTYPE_CODES.values()]


@pytest.fixture(scope="module")
def megatron():
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    return module, torch


def documents_for(dtype: np.dtype, seed: int = 0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    high = 1000 if dtype.kind == "f" else min(np.iinfo(dtype).max, 10**6)
    low = 0 if dtype.kind == "u" else -high
    return [
        [
            rng.integers(low, high, size=int(rng.integers(0, 30))).astype(dtype)
            for _ in range(int(rng.integers(0, 4)))
        ]
        for _ in range(60)
    ]


def read_bytes(prefix: str) -> tuple[bytes, bytes]:
    with open(get_idx_path(prefix), "rb") as idx, open(get_bin_path(prefix), "rb") as data:
        return idx.read(), data.read()


def assert_same(ours: IndexedDataset, theirs) -> None:
    assert len(ours) == len(theirs)
    np.testing.assert_array_equal(ours.sequence_lengths, theirs.sequence_lengths)
    np.testing.assert_array_equal(ours.document_indices, theirs.document_indices)
    np.testing.assert_array_equal(ours.sequence_pointers, theirs.index.sequence_pointers)
    assert ours.dtype == theirs.index.dtype
    for i in range(len(ours)):
        np.testing.assert_array_equal(ours[i], theirs[i])
        if ours.sequence_lengths[i] > 2:
            np.testing.assert_array_equal(ours.get(i, 1, 2), theirs.get(i, 1, 2))
    for a, b in zip(ours[5:20], theirs[5:20]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_megatron_reads_what_we_write(tmp_path, megatron, dtype):
    module, _ = megatron
    documents = documents_for(dtype)
    ours_prefix, theirs_prefix = str(tmp_path / "ours"), str(tmp_path / "theirs")
    ours = IndexedDatasetBuilder(get_bin_path(ours_prefix), dtype=dtype)
    theirs = module.IndexedDatasetBuilder(get_bin_path(theirs_prefix), dtype=dtype.type)
    for k, sequences in enumerate(documents):
        if k % 2:  # exercise both ways of adding a document
            tokens = np.concatenate(sequences) if sequences else np.empty(0, dtype)
            ours.add_document(tokens, [len(s) for s in sequences])
            theirs.add_document(tokens, [len(s) for s in sequences])
        else:
            for sequence in sequences:
                ours.add_item(sequence)
                theirs.add_item(megatron[1].from_numpy(sequence))
            ours.end_document()
            theirs.end_document()
    ours.finalize(get_idx_path(ours_prefix))
    theirs.finalize(get_idx_path(theirs_prefix))
    assert read_bytes(ours_prefix) == read_bytes(theirs_prefix)  # byte for byte
    assert_same(IndexedDataset(ours_prefix), module.IndexedDataset(ours_prefix))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_we_read_what_megatron_writes(tmp_path, megatron, dtype):
    module, torch = megatron
    prefix = str(tmp_path / "meg")
    builder = module.IndexedDatasetBuilder(get_bin_path(prefix), dtype=dtype.type)
    for sequences in documents_for(dtype, seed=1):
        for sequence in sequences:
            builder.add_item(torch.from_numpy(sequence))
        builder.end_document()
    builder.finalize(get_idx_path(prefix))
    theirs = module.IndexedDataset(prefix)
    for mode in ("mmap", "cached", "lazy"):
        assert_same(IndexedDataset(prefix, mode=mode), theirs)


def test_merge_matches_megatron_add_index(tmp_path, megatron):
    module, torch = megatron
    prefixes = []
    for part in range(3):
        prefix = str(tmp_path / f"part{part}")
        builder = module.IndexedDatasetBuilder(get_bin_path(prefix), dtype=np.uint16)
        for sequences in documents_for(np.dtype(np.uint16), seed=10 + part):
            for sequence in sequences:
                builder.add_item(torch.from_numpy(sequence.astype(np.int64)))
            builder.end_document()
        builder.finalize(get_idx_path(prefix))
        prefixes.append(prefix)
    theirs = module.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=np.uint16)
    for prefix in prefixes:
        theirs.add_index(prefix)
    theirs.finalize(str(tmp_path / "theirs.idx"))
    merge_indexed_datasets(prefixes, tmp_path / "ours")
    assert read_bytes(str(tmp_path / "ours")) == read_bytes(str(tmp_path / "theirs"))


def test_multimodal_both_directions(tmp_path, megatron):
    module, torch = megatron
    ours = IndexedDatasetBuilder(str(tmp_path / "ours.bin"), dtype=np.int32, multimodal=True)
    theirs = module.IndexedDatasetBuilder(
        str(tmp_path / "theirs.bin"), dtype=np.int32, multimodal=True
    )
    for k in range(10):
        tokens = np.arange(k + 1, dtype=np.int32)
        ours.add_item(tokens, mode=k % 3)
        theirs.add_item(torch.from_numpy(tokens), mode=k % 3)
        if k % 2:
            ours.end_document()
            theirs.end_document()
    ours.finalize(str(tmp_path / "ours.idx"))
    theirs.finalize(str(tmp_path / "theirs.idx"))
    assert read_bytes(str(tmp_path / "ours")) == read_bytes(str(tmp_path / "theirs"))
    mine = IndexedDataset(str(tmp_path / "theirs"), multimodal=True)
    other = module.IndexedDataset(str(tmp_path / "ours"), multimodal=True)
    for i in range(10):
        (a, mode_a), (b, mode_b) = mine[i], other[i]
        np.testing.assert_array_equal(a, b)
        assert mode_a == mode_b == i % 3


def token_inputs(torch, values: list[int]) -> dict:
    """The same token ids in every form Megatron's builder takes."""
    forms = {"list": list(values), "tuple": tuple(values)}
    if values == list(range(values[0], values[-1] + 1)):
        forms["range"] = range(values[0], values[-1] + 1)
    for name in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        forms[f"numpy {name}"] = np.array(values, dtype=name)
        forms[f"torch {name}"] = torch.tensor(values, dtype=getattr(torch, name))
    return forms


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_builder_takes_any_integer_sequence_byte_identical(tmp_path, megatron, dtype):
    module, torch = megatron
    documents = [[1, 2, 3, 4, 5], [7], [100, 101, 102], [9, 8, 120]]
    ours_item = IndexedDatasetBuilder(str(tmp_path / "item.bin"), dtype=dtype)
    ours_doc = IndexedDatasetBuilder(str(tmp_path / "doc.bin"), dtype=dtype)
    theirs = module.IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=dtype)
    for values in documents:
        for form, tokens in token_inputs(torch, values).items():
            ours_item.add_item(tokens)
            ours_item.end_document()
            ours_doc.add_document(tokens, [len(values)])
            if form.startswith("torch"):
                theirs.add_item(tokens)  # Megatron's add_item needs a tensor
                theirs.end_document()
            else:
                theirs.add_document(tokens, [len(values)])
    for name in ("sequence_lengths", "document_indices"):
        assert getattr(ours_item, name) == getattr(theirs, name)
        assert getattr(ours_doc, name) == getattr(theirs, name)
    assert ours_item.sequence_modes is None and theirs.sequence_modes is None
    ours_item.finalize(str(tmp_path / "item.idx"))
    ours_doc.finalize(str(tmp_path / "doc.idx"))
    theirs.finalize(str(tmp_path / "theirs.idx"))
    expected = read_bytes(str(tmp_path / "theirs"))
    assert read_bytes(str(tmp_path / "item")) == expected
    assert read_bytes(str(tmp_path / "doc")) == expected


def test_builder_public_lists_match_megatron(tmp_path, megatron):
    module, torch = megatron
    source = str(tmp_path / "src")
    builder = IndexedDatasetBuilder(get_bin_path(source), dtype=np.int32, multimodal=True)
    builder.add_document(np.arange(6), [2, 4], modes=[1, 2])
    builder.finalize(get_idx_path(source))
    ours = IndexedDatasetBuilder(str(tmp_path / "ours.bin"), dtype=np.int32, multimodal=True)
    theirs = module.IndexedDatasetBuilder(
        str(tmp_path / "theirs.bin"), dtype=np.int32, multimodal=True
    )
    for builder in (ours, theirs):
        assert builder.sequence_lengths == [] and builder.document_indices == [0]
        assert builder.sequence_modes == []
        builder.add_item(torch.tensor([5, 6, 7]), mode=3)
        builder.add_item(torch.tensor([8]), mode=0)
        builder.end_document()
        builder.add_document(torch.tensor([1, 2, 3]), [1, 2], modes=[4, 5])
        builder.add_index(source)
    for name in ("sequence_lengths", "document_indices", "sequence_modes"):
        mine, other = getattr(ours, name), getattr(theirs, name)
        assert mine == other and list(mine) == [int(v) for v in other], name
        assert len(mine) == len(other) and mine[-1] == other[-1] and mine[1:3] == other[1:3]
        assert all(type(v) is int for v in mine)
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(other))
