"""Open-time validation of .idx files: vectorized in chunks, remembered per file identity,
and applied where training opens its corpora (issue 15, items 1 and 5)."""

import os
import re
import struct

import numpy as np
import pytest

from epochal.cli import main as cli_main
from epochal.data import IndexedDataset, IndexedFileError
from epochal.data.datasets.dataset_builder import GPTDatasetConfig, build_gpt_datasets
from epochal.data.indexed import indexed_validation
from epochal.data.indexed.indexed_format import HEADER_SIZE, get_idx_path
from tests.data.gpt_corpus import random_documents, write_ours

N_DOCS = 40


@pytest.fixture
def corpus(tmp_path):
    """40 one-sequence documents of 5..30 uint16 tokens; returns (prefix, lengths)."""
    docs = random_documents(5, N_DOCS, max_length=30, min_length=5)
    return write_ours(str(tmp_path), "corpus", docs), [len(d) for d in docs]


@pytest.fixture
def fresh_memo(monkeypatch):
    """An empty in-process memo, restored afterwards."""
    monkeypatch.setattr(indexed_validation, "_VALIDATED", set())


def patch_entry(prefix: str, offset: int, data: bytes) -> None:
    """Overwrite bytes of the .idx in place and give it a new mtime (a distinct identity)."""
    path = get_idx_path(prefix)
    with open(path, "r+b") as stream:
        stream.seek(offset)
        stream.write(data)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def length_offset(i: int) -> int:
    return HEADER_SIZE + 4 * i


def pointer_offset(i: int) -> int:
    return HEADER_SIZE + 4 * N_DOCS + 8 * i


def document_offset(k: int) -> int:
    return HEADER_SIZE + 12 * N_DOCS + 8 * k


def gpt_config(prefix: str, cache) -> GPTDatasetConfig:
    return GPTDatasetConfig(
        seq_length=16, seed=1, data_path=[prefix], split="1,0,0", path_to_cache=str(cache)
    )


# --------------------------------------------------------------------------- the vectorized check
@pytest.mark.parametrize("chunk", [3, 7, 1 << 20])
@pytest.mark.parametrize("entry", [0, 1, 2, 3, 6, 7, 20, 39])
def test_first_bad_entry_is_named_across_chunk_boundaries(
    monkeypatch, fresh_memo, corpus, chunk, entry
):
    prefix, lengths = corpus
    monkeypatch.setattr(indexed_validation, "CHUNK", chunk)
    IndexedDataset(prefix)  # intact: passes with any chunk size
    good = 2 * sum(lengths[:entry])
    patch_entry(prefix, pointer_offset(entry), struct.pack("<q", good + 2))
    with pytest.raises(
        IndexedFileError,
        match=re.escape(get_idx_path(prefix))
        + f".*sequence {entry} starts at byte {good + 2}, expected {good}",
    ):
        IndexedDataset(prefix)


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_negative_length_and_decreasing_documents_in_any_chunk(
    monkeypatch, fresh_memo, corpus, chunk
):
    prefix, _ = corpus
    monkeypatch.setattr(indexed_validation, "CHUNK", chunk)
    patch_entry(prefix, length_offset(13), struct.pack("<i", -4))
    with pytest.raises(IndexedFileError, match="sequence 13 has negative length -4"):
        IndexedDataset(prefix)
    patch_entry(prefix, length_offset(13), struct.pack("<i", 1))  # wrong, but not negative
    with pytest.raises(IndexedFileError, match="sequence 14 starts at byte"):
        IndexedDataset(prefix)


@pytest.mark.parametrize("chunk", [3, 1 << 20])
def test_decreasing_document_indices(monkeypatch, fresh_memo, corpus, chunk):
    prefix, _ = corpus
    monkeypatch.setattr(indexed_validation, "CHUNK", chunk)
    patch_entry(prefix, document_offset(9), struct.pack("<q", 30))
    with pytest.raises(IndexedFileError, match=r"decrease at entry 10 \(30 -> 10"):
        IndexedDataset(prefix)


# --------------------------------------------------------------------------- remembering
def count_checks(monkeypatch) -> list[int]:
    calls = []
    real = indexed_validation.check_index_arrays

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("epochal.data.indexed.indexed_reader.check_index_arrays", counting)
    return calls


def test_a_validated_pair_is_remembered_until_it_changes(monkeypatch, fresh_memo, corpus, tmp_path):
    prefix, _ = corpus
    cache = tmp_path / "cache"
    monkeypatch.setattr(indexed_validation, "SETTLE_NS", 0)  # the files count as old enough
    calls = count_checks(monkeypatch)
    IndexedDataset(prefix, validation_cache=cache)
    IndexedDataset(prefix, validation_cache=cache)
    assert len(calls) == 1
    assert len(list(cache.glob("*-validated.json"))) == 1
    indexed_validation._VALIDATED.clear()  # another process: only the record on disk is left
    IndexedDataset(prefix, validation_cache=cache, mode="lazy")
    assert len(calls) == 1
    IndexedDataset(prefix, multimodal=False, validate=True)  # no cache folder: the memo knows it
    assert len(calls) == 1
    patch_entry(prefix, length_offset(3), struct.pack("<i", 2))  # corrupt: new identity
    with pytest.raises(IndexedFileError, match=re.escape(get_idx_path(prefix))):
        IndexedDataset(prefix, validation_cache=cache)
    assert len(calls) == 2


def test_a_just_written_pair_is_checked_every_time(monkeypatch, fresh_memo, corpus, tmp_path):
    # timestamps are coarse: an edit right after the check could keep the identity
    prefix, _ = corpus
    calls = count_checks(monkeypatch)
    IndexedDataset(prefix, validation_cache=tmp_path / "cache")
    with open(get_idx_path(prefix), "r+b") as stream:  # same tick, mtime not moved
        stream.seek(length_offset(3))
        stream.write(struct.pack("<i", -1))
    with pytest.raises(IndexedFileError, match="sequence 3 has negative length"):
        IndexedDataset(prefix, validation_cache=tmp_path / "cache")
    assert len(calls) == 2 and not (tmp_path / "cache").exists()


def test_a_stale_or_garbled_record_means_check_again(monkeypatch, fresh_memo, corpus, tmp_path):
    prefix, _ = corpus
    cache = tmp_path / "cache"
    monkeypatch.setattr(indexed_validation, "SETTLE_NS", 0)
    calls = count_checks(monkeypatch)
    IndexedDataset(prefix, validation_cache=cache)
    (record,) = cache.glob("*-validated.json")
    record.write_text("{not json")
    indexed_validation._VALIDATED.clear()
    IndexedDataset(prefix, validation_cache=cache)
    assert len(calls) == 2


# --------------------------------------------------------------------------- through training
@pytest.mark.parametrize(
    ("offset", "value", "pattern"),
    [
        (length_offset(7), struct.pack("<i", 9), "sequence 8 starts at byte"),  # a changed size
        (length_offset(7), struct.pack("<i", -3), "sequence 7 has negative length -3"),
        # unvalidated: a misleading "holds no tokens" (or numpy's "repeats may not contain ...")
        (length_offset(7), struct.pack("<i", -1000), "sequence 7 has negative length -1000"),
    ],
)
def test_training_data_refuses_a_corrupt_index(
    fresh_memo, corpus, tmp_path, offset, value, pattern
):
    prefix, _ = corpus
    cache = tmp_path / "cache"
    build_gpt_datasets(gpt_config(prefix, cache), [50, 0, 0])  # intact: builds
    patch_entry(prefix, offset, value)
    with pytest.raises(IndexedFileError, match=re.escape(get_idx_path(prefix)) + ".*" + pattern):
        build_gpt_datasets(gpt_config(prefix, tmp_path / "cache2"), [50, 0, 0])


def test_epochal_train_refuses_a_corrupt_index(fresh_memo, tmp_path, capsys):
    # byte-tokenizer ids (< 256), so that without the check training would run on it
    docs = [d % 256 for d in random_documents(5, N_DOCS, max_length=30, min_length=5)]
    prefix = write_ours(str(tmp_path), "corpus", docs)
    patch_entry(prefix, length_offset(7), struct.pack("<i", -3))
    rc = cli_main(
        [
            "train",
            "--data.corpus=",
            f"--data.data_path=['{prefix}']",
            "--data.tokenizer_type=bytes",
            f"--run_dir={tmp_path / 'run'}",
            "--model.hidden_size=32",
            "--model.num_layers=1",
            "--model.num_attention_heads=2",
            "--model.num_query_groups=1",
            "--model.ffn_hidden_size=64",
            "--data.seq_length=16",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=4",
            "--training.train_iters=4",
            "--training.eval_iters=0",
            "--scheduler.lr_warmup_iters=1",
            "--logging.progress=false",
            "--logging.tensorboard=false",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0
    assert get_idx_path(prefix) in err and "sequence 7 has negative length -3" in err
    assert "Traceback" not in err and "repeats" not in err
    assert not any((tmp_path / "run").rglob("*.distcp"))  # nothing trained, nothing saved
    np.testing.assert_array_equal(IndexedDataset(prefix, validate=False).sequence_lengths[7], -3)
