"""Seeded fuzz of fine-tuning tables and ``epochal embed`` inputs (the input hardening's fuzz).

Each case writes a small labelled table (CSV, TSV, gzipped or parquet) of known rows, applies
mutations that must not change what is read (case, spaces, a final ``*``, trailing delimiters,
quoting, CRLF, a byte-order mark, blank lines, column order, an extra column) and at most one
that must be refused (a character outside the alphabet or non-ASCII, another encoding, a
NaN / inf / decimal-comma / empty label, a missing or extra cell or column, a cell over the
length limit, a header without rows, an empty or truncated file), then reads it with the
fine-tuning reader and with ``epochal embed``'s input path. Every outcome must be either the
known rows, exactly, or the reader's own error naming the file: no other exception, no table
whose rows differ from the input's, and the process's peak memory grows by less than 64 MiB.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import math
import random
import resource
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochal.data.datasets.labelled import LabelledDataError, read_labelled_table
from epochal.data.proteins.sequences import ProteinInputError

ENV_MAX_PROTEIN_LENGTH = "EPOCHAL_MAX_PROTEIN_LENGTH"  # the documented override

AMINO = "ACDEFGHIKLMNPQRSTVWYXBZUO"
BAD = ["J", "*", "-", ".", "0", "7", "<", "!", "\x00", "\x01", "é", "ß", "ı", "ſ", "ﬀ", "ﬁ"]
LIMIT = 2000
SAME = ["lower", "spaces", "star", "trailing", "quote_all", "crlf", "bom", "blank", "shuffle",
        "extra_column", "gzip"]  # fmt: skip
# mutation -> (refused by the fine-tuning reader, refused by embed's reader)
REFUSE = {
    "bad_char": (True, True),
    "latin1": (True, True),
    "utf16": (True, True),
    "nan_label": (True, False),
    "inf_label": (True, False),
    "comma_label": (True, False),
    "empty_label": (True, False),
    "missing_cell": (True, True),
    "extra_cell": (True, True),
    "no_label_column": (True, False),
    "no_sequence_column": (True, True),
    "too_long": (True, True),
    "header_only": (True, True),
    "empty_file": (True, True),
    "truncated_gzip": (True, True),
}
TEXT_ONLY = {"trailing", "quote_all", "crlf", "bom", "blank", "gzip", "latin1", "utf16",
             "missing_cell", "extra_cell", "empty_file", "truncated_gzip", "comma_label"}  # fmt: skip


def _rows(rng: random.Random, task: str) -> list[dict[str, str]]:
    rows = []
    for i in range(rng.randint(1, 5)):
        seq = "".join(rng.choice(AMINO) for _ in range(rng.randint(3, 30)))
        label = f"{rng.uniform(-3, 3):.4f}" if task == "sequence_regression" else rng.choice("ab")
        rows.append({"id": f"p{i}-{rng.randint(0, 99)}", "sequence": seq, "label": label})
    return rows


def _case(rng: random.Random, folder, n: int, task: str):
    """``(path, expected rows, refusing mutation or None, applied mutations)`` of case ``n``."""
    rows = _rows(rng, task)
    expected = [dict(r) for r in rows]
    parquet = rng.random() < 0.2
    same = rng.sample(SAME, rng.randint(0, 4))
    refuse = rng.choice(list(REFUSE)) if rng.random() < 0.6 else None
    if parquet:
        same = [m for m in same if m not in TEXT_ONLY]
        refuse = None if refuse in TEXT_ONLY else refuse
    if refuse == "missing_cell" and "trailing" in same:  # "a,b," then reads as an empty cell
        same.remove("trailing")
    columns = ["id", "sequence", "label"]
    for row in rows:
        if "lower" in same:
            row["sequence"] = "".join(
                c.lower() if rng.random() < 0.5 else c for c in row["sequence"]
            )
        if "spaces" in same:
            k = rng.randint(0, len(row["sequence"]))
            row["sequence"] = f" {row['sequence'][:k]} {row['sequence'][k:]} "
        if "star" in same:
            row["sequence"] += "*"
    if "shuffle" in same:
        rng.shuffle(columns)
    if "extra_column" in same:
        columns.insert(rng.randint(0, 3), "note")
        for row in rows:
            row["note"] = rng.choice(["x", "", "MKJ*<>", "1.5"])
    victim = rng.randrange(len(rows))
    if refuse == "bad_char":
        seq = rows[victim]["sequence"]
        k = rng.randint(0, len(seq) - 1)  # (before a final '*', which stays allowed)
        rows[victim]["sequence"] = seq[:k] + rng.choice(BAD) + seq[k:]
    elif refuse in ("latin1", "utf16"):
        rows[victim]["id"] += "é"  # an id that differs when decoded as UTF-8
    elif refuse in ("nan_label", "inf_label", "comma_label", "empty_label"):
        if task != "sequence_regression" and refuse != "empty_label":
            refuse = "empty_label"
        value = {"nan_label": "nan", "inf_label": "-inf", "comma_label": "1,5"}.get(refuse, "")
        rows[victim]["label"] = value
    elif refuse == "too_long":
        rows[victim]["sequence"] = "M" * (LIMIT + rng.randint(1, 50))
    elif refuse == "no_label_column":
        columns.remove("label")
    elif refuse == "no_sequence_column":
        columns.remove("sequence")
    suffix = ".parquet" if parquet else rng.choice([".csv", ".tsv"])
    gz = "gzip" in same or refuse == "truncated_gzip"
    path = folder / f"case{n}{suffix}{'.gz' if gz else ''}"
    if parquet:
        kept = [] if refuse == "header_only" else rows
        data = {c: pa.array([r[c] for r in kept], pa.string()) for c in columns}
        if "label" in data and task == "sequence_regression" and rng.random() < 0.5:
            values = [r["label"] for r in kept]
            data["label"] = [float(v) if v not in ("", "1,5") else None for v in values]
        pq.write_table(pa.table(data), path)
        return path, expected, refuse, same
    sep = "," if suffix == ".csv" else "\t"
    out = io.StringIO()
    quoting = csv.QUOTE_ALL if "quote_all" in same else csv.QUOTE_MINIMAL
    end = "\r\n" if "crlf" in same else "\n"
    writer = csv.writer(out, delimiter=sep, quoting=quoting, lineterminator=end)
    writer.writerow(columns)
    for i, row in enumerate(rows):
        cells = [row[c] for c in columns]
        if i == victim and refuse == "missing_cell":
            cells = cells[:-1]
        if i == victim and refuse == "extra_cell":
            cells.append("surplus")
        writer.writerow(cells)
    text = out.getvalue()
    if "trailing" in same:
        text = end.join(line + sep for line in text.split(end)[:-1]) + end
    if "blank" in same:
        text = text.replace(end, end + end, rng.randint(1, 3))
    if refuse == "header_only":
        text = text.split(end)[0] + end
    if refuse == "empty_file":
        text = ""
    encoding = {"latin1": "latin-1", "utf16": "utf-16"}.get(refuse or "", "utf-8")
    data = text.encode(encoding)
    if "bom" in same and encoding == "utf-8":
        data = b"\xef\xbb\xbf" + data
    if gz:
        data = gzip.compress(data)
        if refuse == "truncated_gzip":
            data = data[: max(10, len(data) // 2)]
    path.write_bytes(data)
    return path, expected, refuse, same


def _outcome(read, error: type[Exception], path):
    try:
        return read(), None
    except error as exc:
        message = str(exc)
        assert str(path) in message, message  # names the file
        assert "\n" not in message, message  # one line
        return None, message


def test_fuzzed_tables_are_read_exactly_or_refused_naming_the_file(tmp_path, monkeypatch):
    from epochal.commands.embed import _read_input

    monkeypatch.setenv(ENV_MAX_PROTEIN_LENGTH, str(LIMIT))
    rng = random.Random(20240529)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counts = {"accepted": 0, "refused": 0}
    for n in range(300):
        task = rng.choice(["sequence_regression", "sequence_classification"])
        path, expected, refuse, same = _case(rng, tmp_path, n, task)
        where = f"case {n}: {path.name} {same} {refuse}"
        labels = 1 if "regression" in task else None
        tuned, _ = _outcome(
            partial(read_labelled_table, path, task, num_labels=labels), LabelledDataError, path
        )
        args = argparse.Namespace(input=str(path), sequence_column="sequence", id_column="id")
        embedded, _ = _outcome(partial(_read_input, args), ProteinInputError, path)
        refuse_tuned, refuse_embed = REFUSE.get(refuse, (False, False))
        sequences = [r["sequence"] for r in expected]
        if refuse_tuned:
            assert tuned is None, where
        else:
            assert tuned is not None, where
            assert tuned.sequences == sequences, where
            labels = [r["label"] for r in expected]
            if "regression" in task:  # a parquet float column reads back as a float
                assert [float(v) for v in tuned.labels] == [float(v) for v in labels], where
                assert all(math.isfinite(float(v)) for v in tuned.labels), where
            else:
                assert tuned.labels == labels, where
        if refuse_embed:
            assert embedded is None, where
        else:
            assert embedded is not None, where
            ids, got, _ = embedded
            assert (ids, got) == ([r["id"] for r in expected], sequences), where
        counts["accepted" if tuned is not None else "refused"] += 1
    assert min(counts.values()) > 60, counts  # both sides of the rules were exercised
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mib < 64, grown_mib


@pytest.mark.parametrize("limit", ["0", "-5", "1e6"])
def test_a_bad_limit_is_named(tmp_path, monkeypatch, limit):
    monkeypatch.setenv(ENV_MAX_PROTEIN_LENGTH, limit)
    (tmp_path / "t.csv").write_text("sequence,label\nMKT,a\n")
    with pytest.raises(ValueError, match=f"{ENV_MAX_PROTEIN_LENGTH}='{limit}' is .* from 1 to"):
        read_labelled_table(tmp_path / "t.csv", "sequence_classification")
