"""ESM-2's vocabulary where models leave or enter epochal: the HF export ships ESM-2's
vocab.txt (AutoTokenizer reads it as EsmTokenizer), and `epochal fill-mask` reads an ESM
folder's vocab.txt as ESM-2's, not as WordPiece; predictions equal transformers'."""

from __future__ import annotations

import json

import pytest
import torch

from epochal.cli import main
from epochal.convert import save_hf_checkpoint
from epochal.data import ESM2Tokenizer
from epochal.model.build import build_model
from tests.convert.hf_models import encoder_like, randomize
from tests.data.esm_vocab import ESM2_VOCAB_TXT

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.peer

TEXT = "MQIFVKTLTGKT<mask>TLEVEPSD<mask>IENVK"


def test_export_ships_esm_vocab_and_fill_mask_equals_transformers(tmp_path):
    config = encoder_like("esm", token_dropout=False)
    model = randomize(build_model(config, seed=2), 2).eval()
    folder = tmp_path / "hf"
    files = ESM2Tokenizer().hf_tokenizer_files(model_max_length=64)
    save_hf_checkpoint(config, model.state_dict(), folder, extra_files=files)
    assert (folder / "vocab.txt").read_text() == ESM2_VOCAB_TXT
    out = tmp_path / "preds.jsonl"
    argv = ["fill-mask", "--checkpoint", str(folder), "--text", TEXT, "--top-k", "4"]
    assert main([*argv, "--output", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = transformers.EsmForMaskedLM.from_pretrained(str(folder)).eval()
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        probs = hf(input_ids=ids).logits[0].float().softmax(-1)
    positions = (ids[0] == tokenizer.mask_token_id).nonzero().flatten().tolist()
    assert len(positions) == len(record["predictions"]) == 2
    for pos, ours in zip(positions, record["predictions"]):
        values, indices = probs[pos].topk(4)
        assert [p[0] for p in ours] == tokenizer.convert_ids_to_tokens(indices.tolist())
        assert [p[1] for p in ours] == pytest.approx(values.tolist(), abs=1e-5)


def test_run_tokenizer_info_carries_the_esm_files(monkeypatch):
    from epochal.convert import formats
    from epochal.train.state import epochal_ckpt

    monkeypatch.setattr(epochal_ckpt, "run_tokenizer", lambda ck: ESM2Tokenizer())
    info = formats._run_tokenizer_info(None)
    assert (info["bos"], info["eos"], info["pad"]) == (0, 2, 1)
    assert info["tokenizer_files"]["vocab.txt"] == ESM2_VOCAB_TXT
    assert "tokenizer_json" not in info
