"""Token ids given as decimal strings (issue 26), as Megatron-Core's builder takes them.

Megatron-LM's own ``tests/unit_tests/data/test_builder.py`` (``create_file_prefixes``) writes
its test corpora with ``builder.add_document([str(id) ...], [n])``: numpy's string-to-integer
cast (Python's ``int()``) reads them. The expected files come from megatron-core itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from epochal.data import IndexedDataset, IndexedDatasetBuilder
from tests.data.test_indexed_peer import megatron, read_bytes  # noqa: F401 - a fixture

DOCS = [["1", "2", "300"], [" 3", "+5", "1_000"], ["7"], [b"8", b"9"]]


def _write(builder, docs):
    for doc in docs:
        builder.add_document(doc, [len(doc)])


def test_decimal_strings_are_token_ids(tmp_path):
    b = IndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16)
    _write(b, DOCS)
    b.add_document(np.array(["11", "12"]), [2])  # a numpy string array too
    b.finalize(str(tmp_path / "d.idx"))
    got = [IndexedDataset(str(tmp_path / "d"))[i].tolist() for i in range(5)]
    assert got == [[1, 2, 300], [3, 5, 1000], [7], [8, 9], [11, 12]]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (["1", "1.5"], r"token 1 is '1\.5', not a decimal integer"),
        (["0x10"], "not a decimal integer"),
        ([""], "not a decimal integer"),
        (["-1"], "do not fit uint16"),
        (["70000"], "do not fit uint16"),
    ],
)
def test_bad_decimal_strings_are_refused_naming_the_token(tmp_path, doc, message):
    b = IndexedDatasetBuilder(str(tmp_path / "d.bin"), dtype=np.uint16)
    with pytest.raises(ValueError, match=message):
        b.add_document(doc, [len(doc)])


@pytest.mark.peer
def test_byte_identical_to_megatron_core(tmp_path, megatron):  # noqa: F811
    module, _ = megatron
    for name, cls in (("ours", IndexedDatasetBuilder), ("theirs", module.IndexedDatasetBuilder)):
        b = cls(str(tmp_path / f"{name}.bin"), dtype=np.uint16)
        _write(b, DOCS)
        b.finalize(str(tmp_path / f"{name}.idx"))
    assert read_bytes(str(tmp_path / "ours")) == read_bytes(str(tmp_path / "theirs"))
    for bad in (["1.5"], ["0x10"]):  # megatron-core refuses these too
        with pytest.raises(ValueError):
            module.IndexedDatasetBuilder(str(tmp_path / "x.bin"), dtype=np.uint16).add_document(
                bad, [1]
            )
