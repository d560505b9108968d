"""One set of protein rules for every reader: pretraining files, fine-tuning tables, BioNeMo
databases, and the errors that name the file, row and limit (findings 1, 3, 8, 9, 14 of the
input hardening, and the unclear errors of its list)."""

from __future__ import annotations

import gzip
import re
import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from epochal.data import (
    ESMMaskedResidueDataset,
    ProteinInputError,
    ProteinSQLiteDataset,
    read_mmseqs_clusters,
    read_proteins,
)
from epochal.data.datasets.labelled import (
    LabelledDataError,
    read_labelled_table,
    read_sequence_table,
)
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.data.proteins.esm_dataset import random_crop
from epochal.data.proteins.layout import read_train_clusters, read_valid_clusters
from epochal.data.proteins.sequences import clean_sequence

ENV_MAX_PROTEIN_LENGTH = "EPOCHAL_MAX_PROTEIN_LENGTH"  # the documented override


def _write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding))
    return path


def test_finetune_tables_follow_the_pretraining_rules(tmp_path):
    """Finding 1: a fine-tuning table is cleaned and checked as pretraining inputs are, and
    ``epochal embed``'s reader gives the very same sequences (no separate upper-casing)."""
    table = _write(tmp_path / "t.csv", "sequence,label\nmkt ay,a\nQQR*,b\nAcDe,a\n")
    tuned = read_labelled_table(table, "sequence_classification")
    embedded = [r[1] for r in read_proteins(table)]
    assert tuned.sequences == embedded == ["MKTAY", "QQR", "ACDE"]
    tok = ESM2Tokenizer()
    assert all(tok.unk not in tok.encode(s) for s in tuned.sequences)
    for bad, shown in [
        ("MKJ", "'J'"),
        ("M*K", r"'\*'"),
        ("MK\x00T", r"'\\x00'"),
        ("MK-T.", "'-', '.'"),
    ]:
        path = _write(tmp_path / "bad.csv", f"sequence,label\nMKT,a\n{bad},b\n")
        with pytest.raises(
            LabelledDataError, match=rf"bad.csv: row 2: characters outside .*{shown}"
        ):
            read_labelled_table(path, "sequence_classification")
        with pytest.raises(ProteinInputError, match=rf"bad.csv:row 2 .*{shown}"):
            list(read_proteins(path))
    # a per-residue table in lower case is the upper-case table (it was one <unk> per row)
    residues = _write(tmp_path / "r.tsv", "sequence\tlabel\nmktay\tHHCCE\n")
    assert read_labelled_table(residues, "residue_classification").sequences == ["MKTAY"]


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_trailing_delimiters_do_not_shift_columns(tmp_path, suffix, sep):
    """Finding 3: ``MKTAYIAKQR,a,`` under ``sequence,id`` keeps its columns, for the
    pretraining / embed reader and the fine-tuning reader alike."""
    rows = [("MKTAYIAKQR", "a"), ("QQRS", "b")]
    for header_end in ("", sep):
        text = f"sequence{sep}id{header_end}\n" + "".join(f"{s}{sep}{i}{sep}\n" for s, i in rows)
        path = _write(tmp_path / f"t{suffix}", text)
        got = [r[:2] for r in read_proteins(path, id_column="id")]
        assert got == [(i, s) for s, i in rows]
        assert read_sequence_table(path, id_column="id").ids == ["a", "b"]
        assert read_sequence_table(path).sequences == [s for s, _ in rows]
    extra = _write(tmp_path / f"x{suffix}", f"sequence{sep}id\nMKT{sep}a{sep}oops\n")
    with pytest.raises(
        ProteinInputError, match=r"x\.\w+: row 1 \(line 2\) has 3 cells, the header 2"
    ):
        list(read_proteins(extra, id_column="id"))
    with pytest.raises(LabelledDataError, match=r"row 1 \(line 2\) has 3 cells"):
        read_sequence_table(extra)


@pytest.mark.parametrize("char", ["ß", "ı", "ſ", "ﬀ", "ﬁ", "\u00a0", "Ａ"])
def test_unicode_is_refused_not_case_folded(tmp_path, char):
    """Finding 8: ``str.upper`` would turn these into residues (``ß`` -> ``SS``, ``ı`` -> ``I``,
    ``ﬁ`` -> ``FI``); every non-ASCII character is refused, naming it."""
    with pytest.raises(
        ProteinInputError, match=f"here: non-ASCII characters {re.escape(repr(char))}"
    ):
        clean_sequence(f"mk{char}a", "here")
    fasta = _write(tmp_path / "u.fasta", f">p1\nMK{char}A\n")
    with pytest.raises(ProteinInputError, match=r"u.fasta:1 \(>p1\): non-ASCII"):
        list(read_proteins(fasta))
    table = _write(tmp_path / "u.csv", f"sequence,label\nMKT,1\nmk{char}a,2\n")
    with pytest.raises(LabelledDataError, match=r"u.csv: row 2: non-ASCII"):
        read_labelled_table(table, "sequence_regression")


def _database(path, rows):
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE protein (id TEXT PRIMARY KEY, sequence TEXT)")
    conn.executemany("INSERT INTO protein VALUES (?, ?)", rows)
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    "bad, message",
    [
        ("mktay", r"row 2 \(id 'B'\): characters outside the protein alphabet: 'a', 'k'"),
        ("", r"row 2 \(id 'B'\): empty sequence"),
        (12345, r"row 2 \(id 'B'\): characters outside the protein alphabet: '1', '2'"),
        (b"MKT", r"row 2 \(id 'B'\): the sequence is blob, not text"),
        (None, r"row 2 \(id 'B'\): the sequence is null, not text"),
    ],
)
def test_bionemo_databases_are_checked_when_opened(tmp_path, bad, message):
    """Finding 9: lower-case, empty, numeric and NULL sequences are refused when the database
    is opened (it used to train on nothing, or fail mid-run with an AttributeError)."""
    db = _database(tmp_path / "p.sqlite", [("A", "MKTAY"), ("B", bad)])
    with pytest.raises(ProteinInputError, match=rf"p.sqlite: {message}"):
        ProteinSQLiteDataset(db)


def test_database_rows_beyond_the_sample_are_checked_when_read(tmp_path):
    """Finding 9: opening reads every row's type but only a sample's text; a bad row it did
    not sample stops at its first read with the database and id named."""
    rows = [(f"P{i:04d}", "MKTAY") for i in range(600)]
    rows[301] = ("P0301", "mkjay")
    db = ProteinSQLiteDataset(_database(tmp_path / "big.sqlite", rows))
    assert db["P0000"] == "MKTAY"
    with pytest.raises(ProteinInputError, match=r"big.sqlite: protein 'P0301': characters"):
        db["P0301"]


def test_cluster_files_with_integer_ids_or_no_rows_are_refused(tmp_path):
    """Finding 9 (integer ``ur90_id`` members) and the zero-row cluster parquets."""
    pq.write_table(pa.table({"ur90_id": [[1, 2], [3]]}), tmp_path / "ints.parquet")
    with pytest.raises(ProteinInputError, match=r"ints.parquet: column 'ur90_id' holds list<"):
        read_train_clusters(tmp_path / "ints.parquet")
    pq.write_table(
        pa.table({"ur90_id": pa.array([], pa.list_(pa.string()))}), tmp_path / "none.parquet"
    )
    with pytest.raises(ProteinInputError, match="none.parquet: no training clusters"):
        read_train_clusters(tmp_path / "none.parquet")
    pq.write_table(pa.table({"ur50_id": pa.array([], pa.string())}), tmp_path / "v.parquet")
    with pytest.raises(ProteinInputError, match="v.parquet: no validation clusters"):
        read_valid_clusters(tmp_path / "v.parquet")


def test_lines_cells_and_records_are_bounded(tmp_path, monkeypatch):
    """Finding 14: a FASTA line, a FASTA record, a table cell and a parquet value over the
    limit stop the reader with the file, record and limit named (and how to raise it)."""
    big_cell = "A" * 140_000  # over the csv module's own 131,072: within the protein limit
    ok = _write(tmp_path / "ok.csv", f"sequence\n{big_cell}\n")
    assert [len(r[1]) for r in read_proteins(ok)] == [140_000]
    monkeypatch.setenv(ENV_MAX_PROTEIN_LENGTH, "1000")
    limit = rf"longer than 1,000 characters \(the limit .*set {ENV_MAX_PROTEIN_LENGTH}"
    with pytest.raises(ProteinInputError, match=r"ok.csv:2: a row \(1,000 characters per cell"):
        list(read_proteins(ok))
    cell = _write(tmp_path / "cell.csv", f"sequence\n{'A' * 1001}\n")
    with pytest.raises(ProteinInputError, match=rf"cell.csv:2: a cell {limit}"):
        list(read_proteins(cell))
    line = _write(tmp_path / "line.fasta", ">p\n" + "A" * 5000 + "\n")
    with pytest.raises(ProteinInputError, match=rf"line.fasta:2: a line {limit}"):
        list(read_proteins(line))
    record = _write(tmp_path / "rec.fasta", ">p1\nMK\n>p2\n" + "ACDEFGHIK\n" * 200)
    with pytest.raises(ProteinInputError, match=rf"rec.fasta:3 \(>p2\): a sequence {limit}"):
        list(read_proteins(record))
    pq.write_table(pa.table({"sequence": ["MK", "A" * 2000]}), tmp_path / "p.parquet")
    with pytest.raises(ProteinInputError, match=rf"p.parquet: row 2: a value {limit}"):
        list(read_proteins(tmp_path / "p.parquet"))
    with pytest.raises(LabelledDataError, match=rf"big.csv:2: a cell {limit}"):
        read_sequence_table(_write(tmp_path / "big.csv", f"sequence,label\n{'A' * 1001},x\n"))
    monkeypatch.setenv(ENV_MAX_PROTEIN_LENGTH, "lots")
    with pytest.raises(ProteinInputError, match=f"{ENV_MAX_PROTEIN_LENGTH}=.lots. is not a whole"):
        list(read_proteins(ok))


def test_crop_happens_before_tokenizing():
    """Finding 14: a long protein's sample is its window, cut from the text before
    tokenizing: the same draws and tokens as tokenizing the whole protein, then cropping."""
    rng = np.random.default_rng(3)
    letters = np.array(list("ACDEFGHIKLMNPQRSTVWYXBZUO"))
    proteins = {f"p{i}": "".join(rng.choice(letters, int(rng.integers(1, 90)))) for i in range(40)}
    dataset = ESMMaskedResidueDataset(proteins, [[k] for k in proteins], seed=5, max_seq_length=24)
    for key, sequence in proteins.items():
        for epoch in range(3):
            ours, theirs = (np.random.default_rng([5, epoch, 0]) for _ in range(2))
            cut = dataset._cropped_tokens(sequence, ours)
            whole = random_crop(dataset.tokenize(sequence), 24, theirs)
            assert cut.tolist() == whole.tolist(), key
            assert ours.integers(1 << 62) == theirs.integers(1 << 62)  # the mask's seed too
    tok = ESM2Tokenizer()
    assert all(tok.one_token_per_character(s) for s in proteins.values())
    assert not any(map(tok.one_token_per_character, ["MK<mask>", "mk", "M K", "Mß"]))


def test_unclear_errors_become_one_line_naming_the_file(tmp_path):
    """The input errors of the list: Latin-1 tables, a decimal comma, an empty MMseqs2 TSV, a
    header-only table; and a FASTA with a byte-order mark is read."""
    latin = _write(tmp_path / "latin.csv", "sequence,name\nMKT,caf\u00e9\n", "latin-1")
    with pytest.raises(ProteinInputError, match=r"latin.csv:2: not UTF-8 text \(byte 0xe9"):
        list(read_proteins(latin, id_column="name"))
    with pytest.raises(LabelledDataError, match=r"latin.csv:2: not UTF-8"):
        read_sequence_table(latin)
    comma = _write(tmp_path / "reg.csv", 'sequence,label\nMKT,0.5\nQQR,"1,5"\n')
    with pytest.raises(
        LabelledDataError, match=r"reg.csv: row 2: regression label '1,5' holds 2 values, model"
    ):
        read_labelled_table(comma, "sequence_regression", num_labels=1)
    empty = _write(tmp_path / "c.tsv", "\n\n")
    with pytest.raises(ProteinInputError, match=r"c.tsv: no clusters \(an empty MMseqs2 TSV"):
        read_mmseqs_clusters(empty)
    header = _write(tmp_path / "h.csv", "sequence,label\n")
    with pytest.raises(LabelledDataError, match="h.csv: no rows"):
        read_sequence_table(header)
    assert list(read_proteins(header)) == []
    bom = tmp_path / "bom.fasta.gz"
    bom.write_bytes(gzip.compress(b"\xef\xbb\xbf>p1 first\nMKT\r\nAY\r\n"))
    assert [r[:2] for r in read_proteins(bom)] == [("p1", "MKTAY")]
    utf16 = _write(tmp_path / "w.csv", "sequence\nMKT\n", "utf-16")
    with pytest.raises(ProteinInputError, match=r"w.csv:1: not UTF-8 text"):
        list(read_proteins(utf16))
