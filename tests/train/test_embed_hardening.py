"""``epochal embed`` / ``fill-mask`` / ``convert`` and the protein cache against hostile inputs
(findings 5, 12, 13 of the input hardening, and the embed / fill-mask errors of its list):
every refusal is one line naming the file, record or option."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from epochal.cli import main
from tests.train import finetune_data as D

pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def esm(tmp_path_factory):
    """A tiny random ESM-2 run (64 positions)."""
    return D.pretrained_esm(tmp_path_factory.mktemp("esm") / "esm")


def test_predictions_take_the_classes_next_to_the_checkpoint(tmp_path, monkeypatch):
    """Finding 5: a classifier names its classes from the ``label_vocab.json`` next to the
    checkpoint, not from a folder named like its recorded, relative ``run_dir`` under the
    current directory; and ``epochal convert`` carries the file, so the converted folders
    keep ``predicted_label``."""
    run = D.pretrained_esm(tmp_path / "classifier", 4, head="sequence_classification", num_labels=2)
    (run / "label_vocab.json").write_text(json.dumps({"labels": ["high", "low"]}))
    table = D.write_table(tmp_path / "t.csv", "sequence_classification", 6, 1)
    work = tmp_path / "work"  # the recorded run_dir is relative ("runs/tiny"): a decoy there
    (work / "runs" / "tiny").mkdir(parents=True)
    (work / "runs" / "tiny" / "label_vocab.json").write_text('{"labels": ["wrong", "names"]}')
    monkeypatch.chdir(work)
    outputs = {"run": tmp_path / "run.parquet", "step": tmp_path / "step.parquet"}
    assert D.embed(run, table, outputs["run"], "--predictions") == 0
    step = run / "checkpoints" / "step_0000000"
    assert D.embed(step, table, outputs["step"], "--predictions") == 0
    for target in ("epochal", "hf"):  # (Hugging Face: next to the head's files)
        folder = tmp_path / f"converted-{target}"
        assert main(["convert", str(run), str(folder), "--to", target]) == 0
        assert json.loads((folder / "label_vocab.json").read_text())["labels"] == ["high", "low"]
    outputs["converted"] = tmp_path / "converted.parquet"
    assert (
        D.embed(tmp_path / "converted-epochal", table, outputs["converted"], "--predictions") == 0
    )
    for name, out in outputs.items():
        labels = {r["predicted_label"] for r in pq.read_table(out).to_pylist()}
        assert labels and labels <= {"high", "low"}, name


def test_outputs_never_overwrite_inputs(tmp_path, esm, capsys):
    """Finding 12: an ``embed`` output equal to its input table or inside its checkpoint
    folder (a Hugging Face folder's ``model.safetensors``) is refused before anything is
    written, as ``convert`` refuses; so are ``fill-mask`` outputs inside the checkpoint."""
    table = tmp_path / "t.parquet"
    pq.write_table(__import__("pyarrow").table({"sequence": ["MKTAY", "QQR"]}), table)
    before = table.read_bytes()
    assert D.embed(esm, table, table) == 2
    assert "--output" in capsys.readouterr().err and table.read_bytes() == before
    hf = tmp_path / "hf"
    assert main(["convert", str(esm), str(hf), "--to", "hf"]) == 0
    weights = (hf / "model.safetensors").read_bytes()
    assert D.embed(hf, table, hf / "model.safetensors") == 2
    err = capsys.readouterr().err
    assert f"--output {hf / 'model.safetensors'} lies inside --checkpoint {hf}" in err
    assert (hf / "model.safetensors").read_bytes() == weights
    argv = ["fill-mask", "--checkpoint", str(esm), "--text", "MK<mask>T"]
    assert main([*argv, "--output", str(esm / "preds.jsonl")]) == 1
    assert "lies inside --checkpoint" in capsys.readouterr().err
    assert not (esm / "preds.jsonl").exists()


def test_dead_processes_cache_temporaries_are_removed(tmp_path):
    """Finding 13: a conversion killed mid-way leaves ``.tmp-proteins-...``; the next one
    removes those of dead processes (old and new names), never a live process's."""
    from epochal.train.inputs.esm import prepare_protein_layout
    from epochal.train.state.run_lock import _host

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    cache = tmp_path / "cache"
    stale = [
        cache / f".tmp-proteins-0123abcd-{pid}",
        cache / f".tmp-proteins-0a.{_host()}.{pid}.0badc0de",
    ]
    live = cache / f".tmp-proteins-0b.{_host()}.{os.getpid()}.1234abcd"
    other_host = cache / f".tmp-proteins-0c.elsewhere.{pid}.5678abcd"
    for folder in [*stale, live, other_host]:
        folder.mkdir(parents=True)
        (folder / "proteins.sqlite").write_bytes(b"\0" * 1024)
    fasta = tmp_path / "p.fasta"
    fasta.write_text(">a\nMKTAY\n>b\nQQRS\n")
    db, train, _ = prepare_protein_layout(fasta, cache, clusters=None, valid_fraction=0.0, seed=0)
    assert db.is_file() and train.is_file()
    assert not any(p.exists() for p in stale)
    assert live.exists() and other_host.exists()


def test_embed_errors_are_one_line_naming_the_file_or_option(tmp_path, esm, capsys):
    """The ``embed`` errors of the list: a header-only table, a protein longer than the
    model's positions (mentions ``--max-length``), an empty checkpoint folder (names
    ``--checkpoint``, not ``checkpoint.init_from``)."""
    header = tmp_path / "h.csv"
    header.write_text("sequence,id\n")
    assert D.embed(esm, header, tmp_path / "h.parquet") == 1
    assert f"{header}: no proteins" in capsys.readouterr().err
    long = tmp_path / "long.fasta"
    long.write_text(">giant\n" + "MKTAYIAKQR" * 20 + "\n")
    assert D.embed(esm, long, tmp_path / "l.parquet") == 1
    err = capsys.readouterr().err
    assert f"{long}:1 (>giant): 202 tokens" in err and "--max-length 64" in err
    assert D.embed(esm, long, tmp_path / "l.parquet", "--max-length", "64") == 0
    rows = pq.read_table(tmp_path / "l.parquet").to_pylist()
    assert len(rows) == 1 and len(rows[0]["embedding"]) == 64
    empty = tmp_path / "empty"
    empty.mkdir()
    assert D.embed(empty, long, tmp_path / "e.parquet") == 1
    err = capsys.readouterr().err
    assert f"--checkpoint='{empty}'" in err and "init_from" not in err
    assert len(err.strip().splitlines()) == 1


def test_embed_cuts_proteins_before_tokenizing():
    """Finding 14: ``embed --max-length`` cuts a protein's text, not its tokens: the same ids
    as encoding it whole; text that is not one token per character is encoded whole."""
    from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
    from epochal.train.embed import encode_cut

    tok = ESM2Tokenizer()
    for text in D.proteins(20, 7, 1, 60):
        assert encode_cut(tok, text, 10) == tok.encode(text)[:10]
    assert encode_cut(tok, "MK<mask>TA", 3) == tok.encode("MK<mask>TA")[:3]


def test_fill_mask_errors_and_esm_folders_from_hugging_face(tmp_path, esm, capsys):
    """The ``fill-mask`` errors of the list: a missing checkpoint and a text without a mask
    are one line (exit 1, no traceback); an ESM folder converted from Hugging Face finds
    ESM-2's ``<mask>``."""
    from epochal.convert import save_hf_checkpoint
    from epochal.model.build import build_model
    from tests.convert.hf_models import encoder_like

    assert main(["fill-mask", "--checkpoint", str(tmp_path / "nope"), "--text", "MK<mask>"]) == 1
    assert "nope: no such file or folder" in capsys.readouterr().err
    assert main(["fill-mask", "--checkpoint", str(esm), "--text", "MKTAY"]) == 1
    assert "has no mask token (<mask>)" in capsys.readouterr().err
    config = encoder_like("esm", token_dropout=False)
    hf = tmp_path / "hf"
    save_hf_checkpoint(config, build_model(config, seed=3).state_dict(), hf)
    converted = tmp_path / "from-hf"
    assert main(["convert", str(hf), str(converted), "--to", "epochal"]) == 0
    capsys.readouterr()
    assert main(["fill-mask", "--checkpoint", str(converted), "--text", "MKT<mask>AY"]) == 0
    out = capsys.readouterr().out
    assert "[MASK] 0:" in out
