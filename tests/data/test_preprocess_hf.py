"""Preprocessing Hugging Face data (save_to_disk folders, parquet, arrow): the JSONL output, byte for byte."""

import glob
import os
import socket

import pytest

from epochal.cli import main
from epochal.data import PreprocessError, build_tokenizer, preprocess_documents
from epochal.data.indexed.preprocess import preprocess
from epochal.data.indexed.preprocess_arrow import read_arrow_chunks

from .test_preprocess import files_of, write_jsonl

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

RECORDS = [
    {"text": "The quick brown fox.", "title": "Fox", "sentences": ["One. ", "", "Two."]},
    {"text": "", "title": "Empty text", "sentences": []},
    {"text": "Unicode: ünïcödé 😀 中文\nnew line", "title": "", "sentences": ["ü"]},
    {"text": "a<|endoftext|>b " * 3, "title": "special", "sentences": ["x", "y"]},
] + [
    {"text": f"document number {i} " + "word " * (i % 11), "title": f"t{i}", "sentences": [f"s{i}"]}
    for i in range(300)
]


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer("gpt2")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Nothing here may touch the network: a connection attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """RECORDS as JSONL, a save_to_disk folder (3 shards), parquet and an arrow IPC file."""
    root = tmp_path_factory.mktemp("hf")
    dataset = datasets.Dataset.from_list(RECORDS)
    dataset.save_to_disk(str(root / "saved"), num_shards=3)
    table = dataset.data.table
    pq.write_table(table, root / "data.parquet", row_group_size=50)
    with pa.OSFile(str(root / "data_file.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=70)
    return {
        "jsonl": write_jsonl(root / "data.jsonl", RECORDS),
        "saved": str(root / "saved"),
        "parquet": str(root / "data.parquet"),
        "arrow": str(root / "data_file.arrow"),
        "dataset": dataset,
    }


def outputs(summary):
    return {key: files_of(prefix) for key, prefix in summary.outputs.items()}


@pytest.mark.parametrize("source", ["saved", "parquet", "arrow"])
def test_same_bytes_as_jsonl(tmp_path, gpt2, saved, source):
    keys = ["text", "title", "sentences"]
    reference = preprocess(saved["jsonl"], tmp_path / "ref", gpt2, json_keys=keys, append_eod=True)
    for workers, chunk_bytes in ((1, 1 << 20), (2, 300)):
        summary = preprocess(
            saved[source],
            tmp_path / f"{source}{workers}",
            gpt2,
            json_keys=keys,
            append_eod=True,
            workers=workers,
            chunk_bytes=chunk_bytes,
        )
        assert summary.documents == len(RECORDS) == reference.documents
        assert summary.tokens == reference.tokens
        assert outputs(summary) == outputs(reference), (source, workers)
    if source == "saved":
        assert summary.files == 3  # the shards, read in state.json order


def test_cli_save_to_disk_two_workers_column_choice(tmp_path, saved, capsys):
    common = ["--tokenizer-type", "gpt2", "--append-eod", "--json-keys", "title", "sentences"]
    assert (
        main(
            ["preprocess", "--input", saved["jsonl"], "--output-prefix", str(tmp_path / "j")]
            + common
        )
        == 0
    )
    args = ["preprocess", "--input", saved["saved"], "--output-prefix", str(tmp_path / "h")]
    assert main(args + common + ["--workers", "2", "--chunk-size", "1k", "--no-progress"]) == 0
    for key in ("title", "sentences"):
        assert files_of(str(tmp_path / f"h_{key}_document")) == files_of(
            str(tmp_path / f"j_{key}_document")
        )
    assert not os.path.exists(tmp_path / "h_text_document.bin")  # only the chosen columns


def test_preprocess_documents_takes_a_dataset_column(tmp_path, gpt2, saved):
    column = saved["dataset"]["text"]
    from_column = preprocess_documents(
        column, gpt2, tmp_path / "column", workers=2, chunk_bytes=500
    )
    from_list = preprocess_documents([r["text"] for r in RECORDS], gpt2, tmp_path / "list")
    assert from_column.documents == len(RECORDS)
    assert files_of(from_column.outputs["text"]) == files_of(from_list.outputs["text"])


def test_reads_in_bounded_chunks(saved):
    """Streaming: every chunk holds about chunk_bytes of text, whatever the file's size."""
    chunks = list(read_arrow_chunks(saved["parquet"], 0, ["text"], chunk_bytes=400))
    assert len(chunks) > 10
    assert [row for chunk, _ in chunks for row in chunk.data] == [(r["text"],) for r in RECORDS]
    assert max(sum(len(text.encode()) for (text,) in chunk.data) for chunk, _ in chunks) < 2 * 400
    assert [chunk.first_line for chunk, _ in chunks][:2] == [1, 1 + len(chunks[0][0].data)]
    assert sum(advance for _, advance in chunks) == os.path.getsize(saved["parquet"])
    for path in [saved["arrow"], *sorted(glob.glob(os.path.join(saved["saved"], "*.arrow")))]:
        chunks = list(read_arrow_chunks(path, 0, ["title"], chunk_bytes=100))  # IPC file, stream
        assert len(chunks) > 5
        for chunk, _ in chunks:  # about chunk_bytes of text: a chunk ends where it is reached
            assert sum(len(title.encode()) + 1 for (title,) in chunk.data[:-1]) < 100
        assert sum(advance for _, advance in chunks) == os.path.getsize(path)


def test_skewed_rows_cut_by_bytes(tmp_path):
    """One batch of small rows and a few big ones: chunks follow the bytes, not the row count."""
    texts = ["small row"] * 500 + ["x" * 50_000] * 3 + ["small row"] * 500
    pq.write_table(pa.table({"text": texts}), tmp_path / "skewed.parquet")
    chunks = list(read_arrow_chunks(str(tmp_path / "skewed.parquet"), 0, ["text"], 4096))
    assert [text for chunk, _ in chunks for (text,) in chunk.data] == texts
    assert all(sum(len(text) + 1 for (text,) in chunk.data[:-1]) < 4096 for chunk, _ in chunks)


def test_dataset_name_not_in_cache_is_a_clear_error(tmp_path, gpt2, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(
        FileNotFoundError, match="no Hugging Face dataset named 'wikitext'.*local cache"
    ):
        preprocess("wikitext", tmp_path / "out", gpt2)
    with pytest.raises(FileNotFoundError, match="'someone/corpus'.*downloads nothing"):
        preprocess("someone/corpus", tmp_path / "out", gpt2)
    assert not list(tmp_path.glob("out*"))


def test_dataset_name_in_cache_is_read(tmp_path, gpt2, saved, monkeypatch):
    """A hub snapshot in the cache: its split's files (symlinks to blobs, as the hub stores them)."""
    snapshot = tmp_path / "hub" / "datasets--someone--corpus" / "snapshots" / "0123abcd"
    (snapshot / "data").mkdir(parents=True)
    os.symlink(saved["parquet"], snapshot / "data" / "train-00000-of-00001.parquet")
    (snapshot / "README.md").write_text("card")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    reference = preprocess(saved["jsonl"], tmp_path / "ref", gpt2, append_eod=True)
    summary = preprocess("someone/corpus", tmp_path / "name", gpt2, append_eod=True)
    assert summary.files == 1 and outputs(summary) == outputs(reference)
    pq.write_table(
        pa.table({"text": ["held out"]}), snapshot / "data" / "test-00000-of-00001.parquet"
    )
    with pytest.raises(
        PreprocessError, match=r"splits \['test', 'train'\]; choose one as someone/corpus:test"
    ):
        preprocess("someone/corpus", tmp_path / "both", gpt2)
    summary = preprocess("someone/corpus:train", tmp_path / "train", gpt2, append_eod=True)
    assert outputs(summary) == outputs(reference)
    assert preprocess("someone/corpus:test", tmp_path / "test", gpt2).documents == 1
    with pytest.raises(
        FileNotFoundError, match="no files of split 'validation'.*downloads nothing"
    ):
        preprocess("someone/corpus:validation", tmp_path / "none", gpt2)


def test_bad_inputs(tmp_path, gpt2, saved):
    dataset_dict = datasets.DatasetDict({"train": saved["dataset"], "test": saved["dataset"]})
    dataset_dict.save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(
        PreprocessError, match=r"DatasetDict with splits \['train', 'test'\].*dict/train"
    ):
        preprocess(tmp_path / "dict", tmp_path / "out", gpt2)
    assert preprocess(tmp_path / "dict" / "train", tmp_path / "train", gpt2).documents == len(
        RECORDS
    )
    with pytest.raises(PreprocessError, match=r"data.parquet: no column 'body'.*'text', 'title'"):
        preprocess(saved["parquet"], tmp_path / "out", gpt2, json_keys=["body"])
    nulls = pa.table({"text": ["fine", None, "also fine"]})
    pq.write_table(nulls, tmp_path / "nulls.parquet")
    with pytest.raises(PreprocessError, match=r"nulls.parquet:2: key 'text' is null"):
        preprocess(tmp_path / "nulls.parquet", tmp_path / "out", gpt2)
    summary = preprocess(tmp_path / "nulls.parquet", tmp_path / "out", gpt2, skip_bad_lines=True)
    assert summary.documents == 2 and summary.bad_lines == 1
    long = pa.table({"text": ["short", "ü" * 40, "x" * 41, "also short"]})
    pq.write_table(long, tmp_path / "long.parquet")
    with pytest.raises(
        PreprocessError, match=r"long.parquet:2: row longer than --max-line-bytes=79"
    ):
        preprocess(tmp_path / "long.parquet", tmp_path / "out", gpt2, max_line_bytes=79)
    summary = preprocess(
        tmp_path / "long.parquet", tmp_path / "out", gpt2, max_line_bytes=80, skip_bad_lines=True
    )
    assert summary.documents == 4 and summary.bad_lines == 0  # 80 bytes each: kept
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(PreprocessError, match="broken.parquet: cannot read as parquet"):
        preprocess(tmp_path / "broken.parquet", tmp_path / "bad", gpt2)
    assert not list(tmp_path.glob("bad*"))


@pytest.mark.parametrize(
    "how", ["from an empty dict", "filtered to nothing", "a DatasetDict split"]
)
def test_an_empty_saved_dataset_is_named_with_its_rows(tmp_path, capsys, how):
    """0 rows: the folder, its split and columns are named (not "matches no file"), nothing
    is written, the CLI exits 1."""
    empty = datasets.Dataset.from_dict({"text": [], "title": []})
    folder = tmp_path / "empty"
    split = "no split name"
    if how == "filtered to nothing":
        rows = datasets.Dataset.from_dict({"text": ["a", "b"], "title": ["x", "y"]})
        empty = rows.filter(lambda row: False)  # writes an .arrow file of 0 rows
    if how == "a DatasetDict split":
        datasets.DatasetDict({"train": empty}).save_to_disk(str(tmp_path / "dict"))
        folder, split = tmp_path / "dict" / "train", "split 'train'"
    else:
        empty.save_to_disk(str(folder))
    expected = (
        f"input {folder}: the save_to_disk dataset at {folder} has 0 rows ({split}, "
        "columns ['text', 'title']); nothing to preprocess, no output written"
    )
    with pytest.raises(PreprocessError) as caught:
        preprocess(folder, tmp_path / "out", build_tokenizer("bytes"))
    assert str(caught.value).startswith(expected)
    args = ["preprocess", "--input", str(folder), "--tokenizer-type", "bytes"]
    assert main([*args, "--output-prefix", str(tmp_path / "out"), "--no-progress"]) == 1
    assert expected in capsys.readouterr().err
    assert not list(tmp_path.glob("out*"))
