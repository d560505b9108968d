"""Reading fine-tuning rows from JSONL, JSON, Parquet and save_to_disk folders, and their errors."""

from __future__ import annotations

import json
import os
import sys

import pytest

from epochal.data.sft import SFTDataError, read_sft_rows, rows_from_records
from tests.data.sft.tiny_chat import CONVERSATIONAL_PC_ROWS, MESSAGES_ROWS, PROMPT_COMPLETION_ROWS
from tests.dist_utils import run_process


def _jsonl(path, records, blank_after=None):
    with open(path, "w", encoding="utf-8") as f:
        for i, record in enumerate(records):
            f.write((record if isinstance(record, str) else json.dumps(record)) + "\n")
            if i == blank_after:
                f.write("\n")
    return str(path)


def _as_dicts(rows):
    out = []
    for row in rows:
        d = {}
        for key in ("messages", "prompt", "completion"):
            value = getattr(row, key)
            if value is not None:
                d[key] = value if isinstance(value, str) else [dict(m) for m in value]
        out.append(d)
    return out


@pytest.mark.parametrize("records", [MESSAGES_ROWS, PROMPT_COMPLETION_ROWS, CONVERSATIONAL_PC_ROWS])
def test_every_file_type_gives_the_same_rows_in_file_order(records, tmp_path):
    datasets = pytest.importorskip("datasets")
    extra = [dict(r, id=i) for i, r in enumerate(records)]  # other columns are ignored
    paths = [_jsonl(tmp_path / "rows.jsonl", extra, blank_after=0)]
    (tmp_path / "rows.json").write_text(json.dumps(extra), encoding="utf-8")
    paths.append(str(tmp_path / "rows.json"))
    table = datasets.Dataset.from_list(extra)
    table.to_parquet(str(tmp_path / "rows.parquet"))
    paths.append(str(tmp_path / "rows.parquet"))
    table.save_to_disk(str(tmp_path / "folder"))
    paths.append(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": table, "test": table.select([0])}).save_to_disk(
        str(tmp_path / "dict")
    )
    for path in paths:
        rows = read_sft_rows(path)
        assert _as_dicts(rows) == records, path
        assert [r.index for r in rows] == list(range(len(records)))
        assert {r.source for r in rows} == {path}
    assert _as_dicts(read_sft_rows(tmp_path / "dict")) == records  # "train" by default
    assert _as_dicts(read_sft_rows(tmp_path / "dict", split="test")) == records[:1]
    jsonl = read_sft_rows(paths[0])
    assert [r.line for r in jsonl] == [1] + list(range(3, len(records) + 2))  # blank line 2


def test_rows_are_the_same_in_another_process(tmp_path):
    """Same file, fresh interpreter with another hash seed: the same rows in the same order."""
    path = _jsonl(tmp_path / "rows.jsonl", MESSAGES_ROWS + MESSAGES_ROWS[::-1])
    code = (
        "import json, sys\n"
        "from epochal.data.sft import read_sft_rows\n"
        "rows = read_sft_rows(sys.argv[1])\n"
        "print(json.dumps([[r.index, r.line, r.messages] for r in rows]))\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    done = run_process([sys.executable, "-c", code, path], env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    here = [[r.index, r.line, [dict(m) for m in r.messages]] for r in read_sft_rows(path)]
    assert json.loads(done.stdout) == here


USER = {"role": "user", "content": "hi"}
BAD_ROWS = [
    ({"messages": [USER, {"role": "tool", "content": "x"}]}, "messages[1] has unknown role 'tool'"),
    (
        {"messages": [{"role": "assistant", "content": "  "}]},
        "messages[0] is an empty assistant turn",
    ),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0] content must be a string"),
    ({"messages": []}, "'messages' must be a non-empty list"),
    ({"prompt": "hi", "completion": ""}, "empty completion"),
    ({"prompt": [USER], "completion": [{"role": "assistant", "content": ""}]}, "empty completion"),
    ({"prompt": "hi", "completion": [USER]}, "both be strings or both be message lists"),
    ({"text": "hi"}, "needs 'messages', or 'prompt' and 'completion' (its keys: text)"),
    ({"messages": [USER], "prompt": "x"}, "has both 'messages' and 'prompt'"),
    ([1, 2], "a row must be an object"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_ROWS)
def test_a_bad_row_is_an_error_naming_file_row_and_line(bad, message, tmp_path):
    path = _jsonl(tmp_path / "chat.jsonl", [MESSAGES_ROWS[0], bad], blank_after=0)
    if "prompt" in str(bad):  # keep the file's format consistent up to the bad row
        path = _jsonl(tmp_path / "chat.jsonl", [PROMPT_COMPLETION_ROWS[0], bad], blank_after=0)
        if isinstance(bad.get("prompt"), list) and isinstance(bad.get("completion"), list):
            path = _jsonl(tmp_path / "chat.jsonl", [CONVERSATIONAL_PC_ROWS[0], bad], blank_after=0)
    with pytest.raises(SFTDataError) as info:
        read_sft_rows(path)
    assert f"{path} row 1 (line 3): " in str(info.value)
    assert message in str(info.value)


def test_file_level_errors(tmp_path):
    bad_json = _jsonl(tmp_path / "a.jsonl", [MESSAGES_ROWS[0], "{not json"])
    with pytest.raises(SFTDataError, match=r"a\.jsonl line 2: not valid JSON"):
        read_sft_rows(bad_json)
    mixed = _jsonl(tmp_path / "b.jsonl", [MESSAGES_ROWS[0], PROMPT_COMPLETION_ROWS[0]])
    with pytest.raises(SFTDataError, match=r"b\.jsonl row 1 \(line 2\): a 'prompt_completion' row"):
        read_sft_rows(mixed)
    (tmp_path / "c.csv").write_text("prompt,completion\n")
    with pytest.raises(SFTDataError, match=r"c\.csv: unknown fine-tuning file type"):
        read_sft_rows(tmp_path / "c.csv")
    (tmp_path / "d.jsonl").write_text("\n\n")
    with pytest.raises(SFTDataError, match=r"d\.jsonl: no rows"):
        read_sft_rows(tmp_path / "d.jsonl")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        read_sft_rows(tmp_path / "missing.jsonl")
    with pytest.raises(SFTDataError, match="applies only to save_to_disk folders"):
        read_sft_rows(bad_json, split="train")
    (tmp_path / "e.parquet").write_bytes(b"not parquet")
    with pytest.raises(SFTDataError, match=r"e\.parquet: not a readable Parquet file"):
        read_sft_rows(tmp_path / "e.parquet")


def test_missing_split_of_a_dataset_dict_folder_names_the_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_list(MESSAGES_ROWS)
    datasets.DatasetDict({"a": table, "b": table}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(SFTDataError, match=r"no split 'train'; the folder has a, b \(set split\)"):
        read_sft_rows(tmp_path / "dict")


def test_rows_from_records_uses_the_given_source_name():
    rows = rows_from_records([(None, PROMPT_COMPLETION_ROWS[0])], source="memory")
    assert rows[0].where == "memory row 0" and rows[0].kind == "prompt_completion"


def test_split_gives_every_row_to_exactly_one_part_as_megatron_core():
    from epochal.data import split_document_ranges, split_sft_rows

    records = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(50)]
    rows = rows_from_records([(None, r) for r in records], source="pc.jsonl")
    train, valid, test = split_sft_rows(rows, "90,8,2")
    assert train + valid + test == rows
    ranges = split_document_ranges("90,8,2", 50)
    assert [len(train), len(valid), len(test)] == [end - beg for beg, end in ranges]
    assert split_sft_rows(rows, "98,2")[2] == []
    with pytest.raises(ValueError):
        split_sft_rows(rows, "-1,2")


def test_a_line_ends_at_newline_only_as_datasets_reads_it(tmp_path):
    """Raw U+2028 / U+2029 / U+0085 inside a string are text, not line ends: the rows read
    as ``datasets`` reads them, and the line numbers after them stay right."""
    datasets = pytest.importorskip("datasets")
    odd = {"prompt": "one\u2028two\u2029three\u0085four\x1cfive", "completion": " six\u2028"}
    path = tmp_path / "odd.jsonl"
    lines = [json.dumps(r, ensure_ascii=False) for r in (odd, PROMPT_COMPLETION_ROWS[0], odd)]
    path.write_text("\n".join(lines) + "\n{broken\n", encoding="utf-8")
    with pytest.raises(SFTDataError, match=r"odd\.jsonl line 4: not valid JSON"):
        read_sft_rows(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = read_sft_rows(path)
    theirs = datasets.load_dataset("json", data_files=str(path), split="train")
    assert [(r.prompt, r.completion) for r in rows] == [
        (t["prompt"], t["completion"]) for t in theirs
    ]
    assert [r.line for r in rows] == [1, 2, 3]


def test_a_line_nested_too_deep_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_text(json.dumps(PROMPT_COMPLETION_ROWS[0]) + "\n" + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(SFTDataError, match=r"deep\.jsonl line 2: JSON nested too deeply"):
        read_sft_rows(path)
    array = tmp_path / "deep.json"
    array.write_text("[" + "[" * 100_000 + "]" * 100_000 + "]")
    with pytest.raises(SFTDataError, match=r"deep\.json: JSON nested too deeply"):
        read_sft_rows(array)


def test_bad_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    good = json.dumps(PROMPT_COMPLETION_ROWS[0]).encode()
    path.write_bytes(good + b"\n" + b'{"prompt": "caf\xe9", "completion": "x"}\n')
    with pytest.raises(SFTDataError, match=r"latin1\.jsonl line 2 column 16: not UTF-8") as info:
        read_sft_rows(path)
    assert info.value.source == str(path) and "save the file as UTF-8" in str(info.value)
    array = tmp_path / "latin1.json"
    array.write_bytes(b"[" + good + b",\n" + b'{"prompt": "caf\xe9", "completion": "x"}]')
    with pytest.raises(SFTDataError, match=r"latin1\.json line 2: not UTF-8"):
        read_sft_rows(array)


@pytest.mark.parametrize(
    ("row", "where"),
    [
        ({"prompt": "caf\ud800e", "completion": " x"}, "prompt"),
        (
            {"messages": [USER, {"role": "assistant", "content": "ok \udfff"}]},
            "messages[1] content",
        ),
    ],
)
def test_a_lone_surrogate_is_named_in_its_row(row, where, tmp_path):
    path = tmp_path / "surrogate.jsonl"
    path.write_text(json.dumps(row) + "\n")  # ensure_ascii: the \ud800 escape JSON allows
    with pytest.raises(SFTDataError) as info:
        read_sft_rows(path)
    text = str(info.value)
    assert text.startswith(f"{path} row 0 (line 1): {where} holds the lone surrogate U+D")
    assert "chat template" not in text and ("'caf\\ud800e'" in text or "'ok \\udfff'" in text)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path):
    import threading

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    outcome = []

    def read():
        try:
            read_sft_rows(fifo)
        except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): release it by opening the write end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("read_sft_rows blocked opening a named pipe")
    assert isinstance(outcome[0], SFTDataError), outcome
    assert str(outcome[0]).startswith(f"{fifo}: a named pipe, not a regular file or a folder")
