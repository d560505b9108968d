"""Preprocess hardening (issue 15): nothing written is an error (item 9), one huge line is
refused in bounded memory (item 11), Megatron's other flags are accepted (item 13)."""

import json
import re
import tracemalloc

import pytest

from epochal.cli import main
from epochal.data import IndexedDataset, PreprocessError, build_tokenizer
from epochal.data.indexed.preprocess import DEFAULT_MAX_LINE_BYTES, preprocess


def run_cli(tmp_path, *flags):
    return main(
        [
            "preprocess",
            "--tokenizer-type",
            "bytes",
            "--output-prefix",
            str(tmp_path / "out"),
            "--no-progress",
            *flags,
        ]
    )


def outputs(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("out", ".out")))


def test_empty_input_is_an_error_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n\n")
    for name in ("empty.jsonl", "blank.jsonl"):
        assert run_cli(tmp_path, "--input", str(tmp_path / name)) == 1
        err = capsys.readouterr().err
        assert f"{name}: nothing to write: the input holds no document" in err
        assert outputs(tmp_path) == []


def test_every_line_bad_or_empty_is_an_error_and_keeps_the_old_corpus(tmp_path, capsys):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "hello"}) + "\n")
    assert run_cli(tmp_path, "--input", str(good)) == 0
    kept = ("bin", "idx", "tokenizer.json")  # the corpus and its tokenizer record
    before = [(tmp_path / f"out_text_document.{s}").read_bytes() for s in kept]
    capsys.readouterr()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"title": "no text"}\n[1, 2]\n')
    assert run_cli(tmp_path, "--input", str(bad), "--skip-bad-lines") == 1
    assert "every line was bad (3 bad lines skipped); no output written" in capsys.readouterr().err
    empty_docs = tmp_path / "empty_docs.jsonl"
    empty_docs.write_text('{"text": ""}\n{"text": []}\nnot json\n')
    assert run_cli(tmp_path, "--input", str(empty_docs), "--skip-bad-lines") == 1
    assert "all 2 documents are empty (1 bad lines skipped)" in capsys.readouterr().err
    after = [(tmp_path / f"out_text_document.{s}").read_bytes() for s in kept]
    assert after == before  # the earlier corpus is untouched, no temporary left
    assert outputs(tmp_path) == [f"out_text_document.{s}" for s in kept]


def huge_line_file(tmp_path, size):
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as stream:
        stream.write(json.dumps({"text": "first"}) + "\n")
        stream.write(json.dumps({"text": "x" * size}) + "\n")
        stream.write(json.dumps({"text": "third"}) + "\n")
        stream.write("not json\n")
    return path


def test_huge_line_is_refused_before_it_is_read(tmp_path):
    path = huge_line_file(tmp_path, 24 << 20)
    tok = build_tokenizer("bytes")
    tracemalloc.start()
    try:
        with pytest.raises(
            PreprocessError, match=rf"{path}:2: line longer than --max-line-bytes=1,048,576"
        ):
            preprocess(path, tmp_path / "out", tok, max_line_bytes=1 << 20, chunk_bytes=64 << 10)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 << 20  # the 24 MB line was never held whole
    assert outputs(tmp_path) == []
    tracemalloc.start()
    try:
        summary = preprocess(
            path,
            tmp_path / "out",
            tok,
            max_line_bytes=1 << 20,
            chunk_bytes=64 << 10,
            skip_bad_lines=True,
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 6 << 20
    assert summary.documents == 2 and summary.bad_lines == 2
    assert summary.bad_line_examples[0] == f"{path}:2: line longer than --max-line-bytes=1,048,576"
    assert summary.bad_line_examples[1].startswith(f"{path}:4: invalid JSON")  # numbering kept
    ds = IndexedDataset(summary.outputs["text"])
    assert [bytes(x.tolist()) for x in ds] == [b"first", b"third"]


def test_long_line_inside_a_chunk_and_the_cli_flag(tmp_path, capsys):
    path = huge_line_file(tmp_path, 5000)
    tok = build_tokenizer("bytes")
    with pytest.raises(
        PreprocessError, match=rf"{path}:2: line longer than --max-line-bytes=4,096"
    ):
        preprocess(path, tmp_path / "out", tok, max_line_bytes=4096, chunk_bytes=1 << 20)
    assert run_cli(tmp_path, "--input", str(path), "--max-line-bytes", "4k") == 1
    assert f"{path}:2: line longer than --max-line-bytes=4,096" in capsys.readouterr().err
    assert (
        run_cli(tmp_path, "--input", str(path), "--max-line-bytes", "4k", "--skip-bad-lines") == 0
    )
    assert len(IndexedDataset(str(tmp_path / "out_text_document"))) == 2
    # under the default limit (32 MiB) the same line is fine
    assert DEFAULT_MAX_LINE_BYTES == 32 << 20
    summary = preprocess(path, tmp_path / "ok", tok, skip_bad_lines=True, chunk_bytes=1024)
    assert summary.documents == 3 and summary.tokens["text"] == 5 + 5000 + 5
    with pytest.raises(SystemExit):
        run_cli(tmp_path, "--input", str(path), "--max-line-bytes", "0")


def test_megatron_flags_are_accepted(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"Doc {i}. Two\nlines."}) + "\n" for i in range(50))
    )
    flags = [
        "--input",
        str(path),
        "--log-interval",
        "10",
        "--partitions",
        "4",
        "--keep-sequential-samples",
        "--max-documents",
        "17",
        "--chunk-size",
        "100",
    ]
    assert run_cli(tmp_path, *flags) == 0
    err = capsys.readouterr().err
    logged = [int(n) for n in re.findall(r"Processed (\d+) documents \(", err)]
    assert logged and 10 <= logged[0] < 17  # once per 10 documents, checked per chunk
    assert "stopped after --max-documents=17" in err
    ds = IndexedDataset(str(tmp_path / "out_text_document"))
    assert len(ds.document_indices) - 1 == 17
    assert bytes(ds[16].tolist()) == b"Doc 16. Two\nlines."
    assert run_cli(tmp_path, *flags, "--split-sentences", "--keep-newlines", "--workers", "2") == 0
    ds = IndexedDataset(str(tmp_path / "out_text_sentence"))
    assert len(ds.document_indices) - 1 == 17 and len(ds) == 34
    assert [bytes(ds[i].tolist()) for i in (0, 1)] == [b"Doc 0. ", b"Two\nlines."]
    for flag, value in (("--max-documents", "0"), ("--log-interval", "-1"), ("--partitions", "x")):
        with pytest.raises(SystemExit):
            run_cli(tmp_path, "--input", str(path), flag, value)
        assert flag in capsys.readouterr().err


def _sigterm_action() -> str:
    import signal

    return "default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else "inherited"


def test_early_stop_closes_the_pool_without_signalling_its_workers(tmp_path, monkeypatch):
    """``--max-documents`` lets the in-flight chunks finish: ``Pool.terminate`` SIGTERMs
    workers that may be writing a result, and one killed holding the result queue's lock
    hangs the pool's join (the test suite once waited on it for an hour)."""
    import multiprocessing.pool

    def refuse(self):
        raise AssertionError("an early stop terminated the pool")

    monkeypatch.setattr(multiprocessing.pool.Pool, "terminate", refuse)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i} " * 40}) + "\n" for i in range(400)))
    flags = ["--input", str(path), "--max-documents", "3", "--chunk-size", "64", "--workers", "2"]
    assert run_cli(tmp_path, *flags) == 0
    ds = IndexedDataset(str(tmp_path / "out_text_document"))
    assert len(ds.document_indices) - 1 == 3
    assert bytes(ds[2].tolist()) == ("doc 2 " * 40).encode()


def test_pool_workers_stop_on_sigterm_whatever_their_parent_handles():
    """An error or an interrupt ends the pool with ``Pool.terminate`` (SIGTERM to each
    worker). A forked worker must not keep its parent's SIGTERM handler (a trainer's
    preemption handler, a test runner's): delivered to one of the worker's other threads,
    the handler never interrupts its main thread, blocked on a queue lock the terminating
    pool holds, and the command never returns."""
    import multiprocessing
    import signal

    from epochal.data.indexed.preprocess_encoding import init_worker

    before = signal.signal(signal.SIGTERM, lambda *args: None)
    try:
        with multiprocessing.get_context("fork").Pool(1, init_worker, (None,)) as pool:
            assert pool.apply(_sigterm_action) == "default"
    finally:
        signal.signal(signal.SIGTERM, before)
