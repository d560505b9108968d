"""``epochal.data.indexed.summary`` and ``prefixes``: the library behind ``inspect`` and ``merge``."""

from __future__ import annotations

import pytest

from epochal.data.indexed.indexed_dataset import IndexedDataset, write_indexed_dataset
from epochal.data.indexed.prefixes import expand_inputs, find_prefixes
from epochal.data.indexed.summary import length_statistics, sample_indices, summarize_indexed
from epochal.data.indexed.tokenizer import ByteLevelTokenizer


def test_summarize_indexed(tmp_path):
    docs = [list(range(5)), [[7] * 3, [8] * 9], [65, 66, 67, 68]]
    prefix = write_indexed_dataset(tmp_path / "d", docs)
    with IndexedDataset(prefix) as ds:
        info = summarize_indexed(ds, samples=2, max_tokens=3, tokenizer=ByteLevelTokenizer())
    assert info["prefix"] == prefix
    assert (info["sequences"], info["documents"], info["tokens"]) == (4, 3, 21)
    assert info["lengths"]["min"] == 3 and info["lengths"]["max"] == 9
    assert [s["index"] for s in info["samples"]] == [0, 3]
    assert info["samples"][1] == {"index": 3, "length": 4, "text": "ABC", "ids": [65, 66, 67]}
    assert info["bin_bytes"] == 21 * 4


def test_length_statistics_and_sample_indices():
    import numpy as np

    stats = length_statistics(np.array([0, 1, 2, 3, 8], dtype=np.int32))
    assert stats["histogram"] == [(0, 1, 1), (1, 2, 1), (2, 4, 2), (4, 8, 0), (8, 16, 1)]
    assert length_statistics(np.array([], dtype=np.int32))["min"] is None
    assert sample_indices(10, 3) == [0, 4, 9] and sample_indices(0, 3) == []


def test_prefixes_of_a_directory(tmp_path):
    for name in ("b", "a"):
        write_indexed_dataset(tmp_path / name, [[1, 2]])
    (tmp_path / "c.idx").write_bytes(b"")  # no .bin: not a pair
    assert find_prefixes(str(tmp_path)) == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert expand_inputs([str(tmp_path / "b"), str(tmp_path)]) == [
        str(tmp_path / "b"),
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    ]
    with pytest.raises(FileNotFoundError, match="neither a directory nor a prefix"):
        expand_inputs([str(tmp_path / "c")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .bin/.idx pair"):
        find_prefixes(str(tmp_path / "empty"))
