"""The protein files that ship with epochal: readable by the protein readers, equal to their source."""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from epochal.data.proteins.examples import EXAMPLE_FILES, copy_examples, example_path
from epochal.data.proteins.examples.__main__ import main as examples_main
from epochal.data.proteins.readers import read_fasta, read_protein_table


def _table(name):
    with open(example_path(name), newline="") as f:
        return list(csv.DictReader(f))


def test_files_read_with_the_protein_readers():
    fasta = list(read_fasta(example_path("proteins.fasta")))
    assert len(fasta) == 300 and all(50 <= len(seq) <= 250 for _, seq, _ in fasta)
    solubility = _table("solubility.csv")
    assert len(solubility) == 200
    assert sorted({r["label"] for r in solubility}) == ["insoluble", "soluble"]
    assert not {r["id"] for r in solubility} & {pid for pid, _, _ in fasta}  # disjoint sets
    records = list(read_protein_table(example_path("disorder.csv"), id_column="id"))
    disorder = _table("disorder.csv")
    assert len(records) == len(disorder) == 80
    for row, (_, seq, _) in zip(disorder, records):
        assert len(row["disorder"]) == len(seq) and set(row["disorder"]) == {"D", "O"}


@pytest.mark.skipif(importlib.util.find_spec("aaanalysis") is None, reason="needs aaanalysis")
def test_sequences_and_labels_equal_aaanalysis_rows():
    root = Path(importlib.util.find_spec("aaanalysis").submodule_search_locations[0])

    def source(name):
        with open(root / "_data" / "benchmarks" / f"{name}.tsv", newline="") as f:
            return {r["entry"]: r for r in csv.DictReader(f, delimiter="\t")}

    soluble = source("SEQ_SOLUBLE")
    for pid, seq, _ in read_fasta(example_path("proteins.fasta")):
        assert soluble[pid]["sequence"] == seq
    for row in _table("solubility.csv"):
        assert soluble[row["id"]]["sequence"] == row["sequence"]
        assert soluble[row["id"]]["label"] == ("1" if row["label"] == "soluble" else "0")
    ldr = source("AA_LDR")
    for row in _table("disorder.csv"):
        labels = ldr[row["id"]]["label"].split(",")
        assert ldr[row["id"]]["sequence"] == row["sequence"]
        assert row["disorder"] == "".join("D" if x == "1" else "O" for x in labels)


def test_copy_writes_every_file_and_never_overwrites_other_content(tmp_path, capsys):
    assert examples_main([str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "p" / n) for n in EXAMPLE_FILES]
    assert copy_examples(tmp_path / "p")  # the same content again: fine
    (tmp_path / "p" / "solubility.csv").write_text("mine\n")
    assert examples_main([str(tmp_path / "p")]) == 1
    assert "solubility.csv exists with other content" in capsys.readouterr().err
    assert (tmp_path / "p" / "solubility.csv").read_text() == "mine\n"
    with pytest.raises(ValueError, match="no example file 'x.fasta'"):
        example_path("x.fasta")
