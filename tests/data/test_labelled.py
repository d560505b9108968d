"""Labelled tables for fine-tuning: formats, errors naming the row, vocabulary, samples."""

from __future__ import annotations

import pytest
import torch

from epochal.data.datasets.labelled import (
    LabelledDataError,
    LabelledSequenceDataset,
    LabelVocab,
    read_labelled_table,
    read_sequence_table,
)
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer


def test_csv_tsv_and_parquet_read_the_same(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [("MKTAY", "b"), ("AILMF", "a"), ("GGSGG", "b")]
    (tmp_path / "t.csv").write_text(
        "id,seq,cls\n" + "".join(f"p{i},{s},{c}\n" for i, (s, c) in enumerate(rows))
    )
    (tmp_path / "t.tsv").write_text(
        "id\tseq\tcls\n" + "".join(f"p{i}\t{s}\t{c}\n" for i, (s, c) in enumerate(rows))
    )
    pq.write_table(
        pa.table(
            {
                "id": [f"p{i}" for i in range(3)],
                "seq": [r[0] for r in rows],
                "cls": [r[1] for r in rows],
            }
        ),
        tmp_path / "t.parquet",
    )
    tables = [
        read_labelled_table(tmp_path / f"t.{ext}", "sequence_classification", "seq", "cls")
        for ext in ("csv", "tsv", "parquet")
    ]
    for t in tables:
        assert t.sequences == [r[0] for r in rows] and t.labels == [r[1] for r in rows]
    assert read_sequence_table(tmp_path / "t.csv", "seq", id_column="id").ids == ["p0", "p1", "p2"]
    assert LabelVocab.from_table(tables[0], "sequence_classification").labels == ["a", "b"]


def test_errors_name_file_and_row(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sequence,label\nMKT,1.5\nAIL,high\n")
    with pytest.raises(LabelledDataError, match=r"bad.csv: row 2: regression label 'high'"):
        read_labelled_table(bad, "sequence_regression")
    with pytest.raises(
        LabelledDataError, match=r"no column 'target' \(columns: \['sequence', 'label'\]\)"
    ):
        read_labelled_table(bad, "sequence_regression", label_column="target")
    empty = tmp_path / "empty.csv"
    empty.write_text("sequence,label\n,1\n")
    with pytest.raises(LabelledDataError, match="row 1: empty sequence"):
        read_labelled_table(empty, "sequence_regression")


def test_samples_have_special_tokens_masks_and_labels():
    tok = ESM2Tokenizer()
    vocab = LabelVocab(list("HCE"))
    ds = LabelledSequenceDataset(
        ["MKTAY", "AILMFVWAAA"],
        ["HHCCE", "HHHHHCCCEX"],
        tok,
        task="residue_classification",
        seq_length=8,
        vocab=vocab,
    )
    a = ds[0]
    assert a["tokens"].tolist() == [tok.cls, *tok.encode("MKTAY"), tok.eos, tok.pad]
    assert a["padding_mask"].tolist() == [1] * 7 + [0]
    assert a["residue_mask"].tolist() == [0, 1, 1, 1, 1, 1, 0, 0]
    assert a["labels"].tolist() == [-100, 2, 2, 0, 0, 1, -100, -100]  # sorted: C=0, E=1, H=2
    b = ds[1]  # cut to seq_length - 2 residues
    assert b["tokens"].tolist() == [tok.cls, *tok.encode("AILMFV"), tok.eos]
    assert b["labels"].tolist() == [-100, 2, 2, 2, 2, 2, 0, -100]
    unseen = LabelledSequenceDataset(
        ["AILMFVWAAA"],
        ["HHHHHCCCEX"],
        tok,
        task="residue_classification",
        seq_length=12,
        vocab=vocab,
    )[0]
    assert unseen["labels"][10].item() == -2  # X: a class training never saw
    reg = LabelledSequenceDataset(
        ["MKT"], ["0.5 2"], tok, task="sequence_regression", seq_length=8, num_labels=2
    )
    assert torch.equal(reg[0]["labels"], torch.tensor([0.5, 2.0]))
    with pytest.raises(LabelledDataError, match="sequence 1: 4 tokens for 3 per-residue labels"):
        LabelledSequenceDataset(
            ["MK<mask>T"], ["HHH"], tok, task="residue_classification", seq_length=8, vocab=vocab
        )[0]
