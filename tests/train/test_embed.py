"""``epochal embed``: Hugging Face ``EsmModel`` parity, input order under DP2, outputs and errors."""

from __future__ import annotations

import json

import pytest
import torch

from tests.train import finetune_data as D

# ESM-2's alphabet as fair-esm's esm/constants.py and every facebook/esm2_* vocab.txt list it.
ESM2_VOCAB = (
    "<cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - <null_1> <mask>"
).split()


def _fasta(path, seqs):
    path.write_text("".join(f">p{i} protein {i}\n{s[:7]}\n{s[7:]}\n" for i, s in enumerate(seqs)))
    return path


@pytest.fixture(scope="module")
def hf_esm(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf_esm")
    config = transformers.EsmConfig(
        vocab_size=33,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        position_embedding_type="rotary",
        pad_token_id=1,
        mask_token_id=32,
        token_dropout=True,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = transformers.EsmModel(config).eval()
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(ESM2_VOCAB) + "\n")
    return folder, model, transformers.EsmTokenizer(str(folder / "vocab.txt"))


@pytest.mark.peer
def test_embeddings_equal_hf_esm_model_mean_over_residues(hf_esm, tmp_path):
    folder, model, tokenizer = hf_esm
    seqs = D.proteins(7, 3) + ["MKTIIDDAYIV"]
    fasta = _fasta(tmp_path / "p.fasta", seqs)
    out = tmp_path / "e.safetensors"
    assert D.embed(str(folder), str(fasta), str(out), "--batch-size", "3", "--per-residue") == 0
    from safetensors import safe_open

    with safe_open(out, "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
        ids = json.loads(f.metadata()["ids"])
    assert ids == [f"p{i}" for i in range(len(seqs))]
    assert got["embeddings"].dtype == torch.float32 and got["embeddings"].shape == (len(seqs), 64)
    for i, s in enumerate(seqs):  # one at a time: no padding on the peer's side
        enc = tokenizer(s, return_tensors="pt")
        with torch.no_grad():
            h = model(**enc).last_hidden_state[0]
        assert torch.allclose(got["embeddings"][i], h[1:-1].mean(0), atol=1e-5), i
        a, b = got["offsets"][i], got["offsets"][i + 1]
        assert torch.allclose(got["residue_embeddings"][a:b], h[1:-1], atol=1e-5), i
    assert D.embed(str(folder), str(fasta), str(tmp_path / "x.safetensors"), "--logits") == 1


@pytest.mark.distributed
def test_order_is_kept_under_dp2(hf_esm, tmp_path):
    from tests.dist_utils import run_gloo
    from tests.train import embed_worker

    folder = hf_esm[0]
    seqs = D.proteins(11, 4)
    fasta = _fasta(tmp_path / "p.fasta", seqs)
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    assert D.embed(str(folder), str(fasta), str(one), "--batch-size", "3", "--per-residue") == 0
    assert run_gloo(embed_worker.rank_main, 2, str(folder), str(fasta), str(two)) == [0, 0]
    from safetensors.torch import load_file

    a, b = load_file(one), load_file(two)
    assert set(a) == set(b)
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=1e-6), key
    assert b["lengths"].tolist() == [len(s) for s in seqs]


def test_finetuned_run_predictions_to_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    from epochal.train.config import build_config
    from epochal.train.state.encoder_init import finetune_overrides
    from epochal.train.trainer import Trainer

    init = D.pretrained_esm(tmp_path / "pre")
    table = D.write_table(tmp_path / "t.csv", "residue_classification", 16, 1)
    args = D.finetune_args(tmp_path / "run", init, table, None, "residue_classification", 2)
    args += ["--training.train_iters=2", "--checkpoint.save_final=true"]
    Trainer(
        build_config(preset=None, overrides=[*finetune_overrides(None, args), *args]), log=False
    ).train()
    out = tmp_path / "p.parquet"
    assert D.embed(str(tmp_path / "run"), str(table), str(out), "--predictions") == 0
    rows = pq.read_table(out).to_pylist()
    seqs = [line.split(",")[0] for line in table.read_text().splitlines()[1:]]
    assert [r["sequence"] for r in rows] == seqs
    assert all(len(r["embedding"]) == 64 for r in rows)
    assert all(len(r["predictions"]) == len(r["sequence"]) for r in rows)
    assert all(
        set(r["predicted_label"]) <= {"C", "H"} and len(r["predicted_label"]) == len(r["sequence"])
        for r in rows
    )
    assert D.embed(str(tmp_path / "run"), str(table), str(tmp_path / "x.parquet"), "--logits") == 1
