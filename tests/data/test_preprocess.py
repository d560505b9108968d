"""Preprocessing JSONL / documents into indexed files; the preprocess, merge and inspect commands."""

import gzip
import json
import os

import numpy as np
import pytest

from epochal.cli import main
from epochal.data import (
    ByteLevelTokenizer,
    IndexedDataset,
    PreprocessError,
    build_tokenizer,
    preprocess_documents,
)
from epochal.data.indexed.indexed_format import get_bin_path, get_idx_path
from epochal.data.indexed.preprocess import preprocess
from epochal.data.indexed.preprocess_encoding import find_input_files

RECORDS = [
    {"text": "The quick brown fox.", "title": "Fox"},
    {"text": "", "title": "Empty text"},
    {"text": ["First sentence. ", "", "Second sentence."], "title": "Sentences"},
    {"text": "Unicode: ünïcödé 😀 中文\nnew line", "title": ""},
    {"text": "a<|endoftext|>b " * 3, "title": "special"},
] + [{"text": f"document number {i} " + "word " * (i % 11), "title": f"t{i}"} for i in range(60)]


def write_jsonl(path, records, extra_lines=()) -> str:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        for line in extra_lines:
            stream.write(line + "\n")
    return str(path)


def files_of(prefix: str) -> tuple[bytes, bytes]:
    with open(get_bin_path(prefix), "rb") as data, open(get_idx_path(prefix), "rb") as index:
        return data.read(), index.read()


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer("gpt2")


def expected_documents(tokenizer, texts, append_eod):
    """Megatron's rules, spelled out: drop empty sentences, EOD after non-empty documents."""
    documents = []
    for text in texts:
        sentences = [tokenizer.encode(s) for s in ([text] if isinstance(text, str) else text)]
        sentences = [s for s in sentences if s]
        if sentences and append_eod:
            sentences[-1] = sentences[-1] + [tokenizer.eod]
        documents.append(sentences)
    return documents


def assert_dataset(prefix, documents):
    ds = IndexedDataset(prefix)
    flat = [s for d in documents for s in d]
    assert [x.tolist() for x in ds] == flat
    np.testing.assert_array_equal(ds.document_indices, np.cumsum([0] + [len(d) for d in documents]))


def test_preprocess_jsonl_two_keys(tmp_path, gpt2):
    path = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    summary = preprocess(path, tmp_path / "out", gpt2, json_keys=["text", "title"], append_eod=True)
    assert summary.outputs == {
        "text": f"{tmp_path}/out_text_document",
        "title": f"{tmp_path}/out_title_document",
    }
    assert summary.documents == len(RECORDS) and summary.files == 1 and summary.bad_lines == 0
    assert summary.dtype == "uint16"
    for key in ("text", "title"):
        documents = expected_documents(gpt2, [r[key] for r in RECORDS], append_eod=True)
        assert_dataset(summary.outputs[key], documents)
        assert summary.tokens[key] == sum(len(s) for d in documents for s in d)
    line = str(summary)
    assert "preprocessed 65 documents" in line and "tokens/s" in line and "\n" not in line
    assert IndexedDataset(summary.outputs["text"]).document_indices[2] == 1  # empty document kept


@pytest.mark.peer
def test_ids_match_transformers_gpt2(tmp_path, gpt2):
    transformers = pytest.importorskip("transformers")
    import shutil

    from epochal.data import find_gpt2_bpe_files

    vocab, merges = find_gpt2_bpe_files()
    shutil.copy(vocab, tmp_path / "vocab.json")
    shutil.copy(merges, tmp_path / "merges.txt")
    reference = transformers.GPT2Tokenizer.from_pretrained(str(tmp_path))
    texts = [r["text"] for r in RECORDS if isinstance(r["text"], str) and r["text"]]
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    summary = preprocess(path, tmp_path / "out", gpt2, append_eod=True, workers=2, chunk_bytes=256)
    ds = IndexedDataset(summary.outputs["text"])
    for i, text in enumerate(texts):
        assert ds[i].tolist() == reference.encode(text) + [reference.eos_token_id]


@pytest.mark.peer
def test_same_files_as_megatron_pipeline(tmp_path, gpt2):
    """Megatron's tools/preprocess_data.py logic with Megatron-Core's builder gives identical bytes."""
    import warnings

    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    path = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    builder = megatron.IndexedDatasetBuilder(
        str(tmp_path / "meg_text_document.bin"), dtype=megatron.DType.optimal_dtype(gpt2.vocab_size)
    )
    with open(path, encoding="utf-8") as stream:
        for line in stream:  # Encoder.encode of preprocess_data.py, per line
            text = json.loads(line)["text"]
            doc_ids, lens = [], []
            for sentence in [text] if isinstance(text, str) else text:
                ids = gpt2.encode(sentence)
                if ids:
                    doc_ids.extend(ids)
                    lens.append(len(ids))
            if doc_ids:
                doc_ids.append(gpt2.eod)
                lens[-1] += 1
            builder.add_document(torch.tensor(doc_ids, dtype=torch.int64), lens)
    builder.finalize(str(tmp_path / "meg_text_document.idx"))
    summary = preprocess(path, tmp_path / "ours", gpt2, append_eod=True)
    assert files_of(summary.outputs["text"]) == files_of(str(tmp_path / "meg_text_document"))


def test_output_independent_of_workers_and_chunking(tmp_path, gpt2):
    path = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    reference = preprocess(path, tmp_path / "one", gpt2, append_eod=True)
    many = preprocess(path, tmp_path / "two", gpt2, append_eod=True, workers=2, chunk_bytes=64)
    assert files_of(reference.outputs["text"]) == files_of(many.outputs["text"])
    assert many.documents == reference.documents and many.tokens == reference.tokens


def test_inputs_gz_directory_and_glob(tmp_path):
    tok = ByteLevelTokenizer()
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    write_jsonl(corpus / "b.jsonl.gz", [{"text": "bb"}])
    write_jsonl(corpus / "a.jsonl", [{"text": "a"}])
    write_jsonl(corpus / "sub" / "c.json", [{"text": "ccc"}])
    (corpus / "notes.txt").write_text("not an input")
    files = find_input_files(corpus)
    assert [os.path.relpath(f, corpus) for f in files] == ["a.jsonl", "b.jsonl.gz", "sub/c.json"]
    assert find_input_files([str(corpus / "*.jsonl*"), str(corpus / "a.jsonl")]) == files[:2]
    summary = preprocess(corpus, tmp_path / "out", tok)
    assert summary.files == 3
    assert [x.tolist() for x in IndexedDataset(summary.outputs["text"])] == [
        [97],
        [98, 98],
        [99, 99, 99],
    ]
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        preprocess(tmp_path / "nothing-here*.jsonl", tmp_path / "x", tok)


def test_bad_lines_fail_or_skip_with_file_and_line(tmp_path):
    tok = ByteLevelTokenizer()
    bad = [
        "{not json",
        '{"title": "no text"}',
        '["a list"]',
        '{"text": 5}',
        "",
        "   ",
        '{"text": "\\ud800"}',
    ]
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": "ok"}], extra_lines=bad)
    path_bytes = tmp_path / "bytes.jsonl"
    path_bytes.write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(PreprocessError, match=r"in\.jsonl:2: invalid JSON.*--skip-bad-lines"):
        preprocess(path, tmp_path / "out", tok)
    assert not any(name.startswith("out") for name in os.listdir(tmp_path))  # nothing half-written
    with pytest.raises(PreprocessError, match=r"bytes\.jsonl:2: invalid UTF-8"):
        preprocess(path_bytes, tmp_path / "out", tok)
    summary = preprocess(
        path, tmp_path / "out", tok, skip_bad_lines=True, workers=2, chunk_bytes=16
    )
    assert summary.bad_lines == 5 and summary.documents == 1
    reasons = "\n".join(summary.bad_line_examples)
    for expected in (
        ":2: invalid JSON",
        ":3: missing key 'text'",
        ":4: expected a JSON object",
        ":5: key 'text' is int",
        ":8: text is not valid Unicode",
    ):
        assert expected in reasons
    assert [x.tolist() for x in IndexedDataset(summary.outputs["text"])] == [[111, 107]]


def test_corrupt_gzip_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl.gz", [{"text": "x" * 1000}] * 50)
    data = open(path, "rb").read()
    with open(path, "wb") as stream:
        stream.write(data[: len(data) // 2])
    with pytest.raises(PreprocessError, match=r"in\.jsonl\.gz: cannot read"):
        preprocess(path, tmp_path / "out", ByteLevelTokenizer(), skip_bad_lines=True)


def test_long_lines_and_tiny_chunks(tmp_path):
    tok = ByteLevelTokenizer()
    records = [{"text": "y" * 5000}, {"text": "z"}, {"text": "w" * 3000}]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    summary = preprocess(path, tmp_path / "out", tok, append_eod=True, chunk_bytes=100)
    ds = IndexedDataset(summary.outputs["text"])
    assert ds.sequence_lengths.tolist() == [5001, 2, 3001] and ds[1].tolist() == [122, 256]


def test_preprocess_documents_and_dtype(tmp_path, gpt2):
    texts = ["hello world", "", ["two ", "sentences"], "last"]
    summary = preprocess_documents(iter(texts), gpt2, tmp_path / "docs", workers=2, chunk_bytes=8)
    assert summary.outputs == {"text": str(tmp_path / "docs")}
    assert_dataset(str(tmp_path / "docs"), expected_documents(gpt2, texts, append_eod=True))
    wide = preprocess_documents(texts, gpt2, tmp_path / "wide", dtype="int32", append_eod=False)
    assert IndexedDataset(str(tmp_path / "wide")).dtype == np.int32 and wide.dtype == "int32"
    with pytest.raises(PreprocessError, match="document 1 is int"):
        preprocess_documents(["fine", 3], gpt2, tmp_path / "bad")
    with pytest.raises(ValueError, match="do not fit uint8"):
        preprocess_documents(["hello"], gpt2, tmp_path / "narrow", dtype="uint8")
    with pytest.raises(ValueError, match="dtype float32 .*integer"):
        preprocess_documents(["hello"], gpt2, tmp_path / "float", dtype="float32")
    assert not list(tmp_path.glob("float*")) and not list(tmp_path.glob(".float*"))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--chunk-size", "inf"], "--chunk-size"),
        (["--chunk-size", "0"], "--chunk-size"),
        (["--workers", "0"], "--workers"),
    ],
)
def test_cli_rejects_bad_runtime_flags(tmp_path, capsys, flags, message):
    args = ["preprocess", "--input", "x.jsonl", "--output-prefix", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        main([*args, "--tokenizer-type", "bytes", *flags])
    assert message in capsys.readouterr().err


def test_cli_preprocess_merge_inspect(tmp_path, capsys):
    first = write_jsonl(tmp_path / "a.jsonl", RECORDS[:3])
    second = write_jsonl(tmp_path / "b.jsonl", RECORDS[3:6], extra_lines=["{broken"])
    common = ["--tokenizer-type", "GPT2BPETokenizer", "--append-eod", "--no-progress"]
    assert (
        main(["preprocess", "--input", first, "--output-prefix", str(tmp_path / "a"), *common]) == 0
    )
    assert "preprocessed 3 documents" in capsys.readouterr().out
    args = ["preprocess", "--input", second, "--output-prefix", str(tmp_path / "b"), *common]
    assert main(args) == 1
    assert "b.jsonl:4: invalid JSON" in capsys.readouterr().err
    assert main([*args, "--skip-bad-lines", "--workers", "2"]) == 0
    captured = capsys.readouterr()
    assert (
        "skipped" in captured.err
        and "b.jsonl:4" in captured.err
        and "1 bad lines skipped" in captured.out
    )

    merged = str(tmp_path / "merged")
    inputs = [str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")]
    assert main(["merge", *inputs, "--output-prefix", merged]) == 0
    assert "merged 2 datasets" in capsys.readouterr().out
    parts = [IndexedDataset(p) for p in inputs]
    assert len(IndexedDataset(merged)) == sum(len(p) for p in parts)
    assert main(["merge", "--input", str(tmp_path / "missing"), "--output-prefix", merged]) == 1
    assert "missing" in capsys.readouterr().err

    assert main(["inspect", merged, "--tokenizer-type", "gpt2", "--samples", "2"]) == 0
    report = capsys.readouterr().out
    assert (
        "documents" in report and "The quick brown fox." in report and "sequence length" in report
    )
    assert main(["inspect", merged, "--json", "--samples", "1"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sequences"] == len(IndexedDataset(merged)) and info["samples"][0]["text"] is None
    assert (
        info["empty_documents"] == 1
        and sum(c for _, _, c in info["lengths"]["histogram"]) == info["sequences"]
    )
    with open(get_idx_path(merged), "r+b") as stream:
        stream.write(b"garbage")
    assert main(["inspect", merged]) == 1
    assert "merged.idx" in capsys.readouterr().err


def test_inspect_decodes_with_the_recorded_tokenizer(tmp_path, capsys):
    docs = write_jsonl(tmp_path / "in.jsonl", RECORDS[:1])
    out = str(tmp_path / "bytes")
    args = ["--input", docs, "--output-prefix", out, "--tokenizer-type", "bytes", "--no-progress"]
    assert main(["preprocess", *args, "--append-eod"]) == 0
    prefix, record = f"{out}_text_document", tmp_path / "bytes_text_document.tokenizer.json"
    capsys.readouterr()
    assert main(["inspect", prefix, "--samples", "1"]) == 0  # no --tokenizer-type
    report = capsys.readouterr().out
    assert f"decoded with ByteLevelTokenizer (recorded in {record})" in report
    assert "'The quick brown fox." in report
    assert main(["inspect", prefix, "--samples", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"][0]["text"].startswith("The quick")
    # a record whose tokenizer no longer gives its ids is not used: ids, and a note why
    changed = json.loads(record.read_text())
    record.write_text(json.dumps({**changed, "fingerprint": "0" * 64}))
    assert main(["inspect", prefix, "--samples", "1"]) == 0
    captured = capsys.readouterr()
    assert "gives other ids than it recorded" in captured.err and "decoded with" not in captured.out
    assert " ".join(str(b) for b in b"The quick") in captured.out
    record.write_text("{")
    assert main(["inspect", prefix]) == 1
    assert "bytes_text_document.tokenizer.json: not a tokenizer record" in capsys.readouterr().err


def test_pool_keeps_a_bounded_number_of_chunks_in_flight(tmp_path):
    from epochal.data.indexed.preprocess import _run_pool
    from epochal.data.indexed.preprocess_encoding import Chunk, ChunkEncoder

    pulled, in_flight = [0], []
    consumed = []

    def chunks():
        for i in range(40):
            pulled[0] += 1
            yield Chunk(-1, i, [f"document {i}"]), 1

    def consume(result, advance):
        in_flight.append(pulled[0] - len(consumed))
        consumed.append(result.outputs[0][0].tolist())

    tok = ByteLevelTokenizer()
    encoder = ChunkEncoder(tok, ["text"], append_eod=False, dtype=np.dtype(np.uint16))
    _run_pool(chunks(), encoder, workers=2, mp_context=None, consume=consume)
    assert consumed == [tok.encode(f"document {i}") for i in range(40)]  # in input order
    assert max(in_flight) <= 2 * 2 + 2
