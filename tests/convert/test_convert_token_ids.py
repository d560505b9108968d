"""The token ids a conversion carries: Hugging Face -> epochal -> Hugging Face keeps them.

The expected ids are those of the source folder's ``config.json`` as ``transformers``
reads it (``AutoConfig``); an id outside the model's vocabulary is refused.
"""

from __future__ import annotations

import json

import pytest

from epochal._checksum import MANIFEST, build_manifest
from epochal.cli import main
from epochal.formats.common import ConversionError
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from tests.convert.hf_models import hf_decoder

pytestmark = pytest.mark.peer
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    ("bos", "eos", "route"),
    [
        (None, None, ["epochal"]),
        (0, 1, ["epochal"]),
        (3, [1, 2], ["epochal", "safetensors"]),
        (0, 1, ["safetensors"]),
    ],
)
def test_hf_to_epochal_and_back_keeps_the_token_ids(tmp_path, bos, eos, route):
    hf_decoder("qwen3", vocab=100, bos_token_id=bos, eos_token_id=eos).save_pretrained(
        tmp_path / "hf"
    )
    source = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert (source.bos_token_id, source.eos_token_id) == (bos, eos)
    last = tmp_path / "hf"
    for i, target in enumerate(route):
        out = tmp_path / (f"{i}.safetensors" if target == "safetensors" else f"{i}")
        assert main(["convert", str(last), str(out), "--to", target]) == 0
        last = out
    assert main(["convert", str(last), str(tmp_path / "back"), "--to", "hf"]) == 0
    back = transformers.AutoConfig.from_pretrained(tmp_path / "back")
    assert (back.bos_token_id, back.eos_token_id) == (source.bos_token_id, source.eos_token_id)


def test_an_id_outside_the_vocabulary_is_refused_before_anything_is_written(tmp_path, capsys):
    hf_decoder("qwen3", vocab=100).save_pretrained(tmp_path / "hf")
    argv = ["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--to", "hf"]
    assert main([*argv, "--eos-token-id", "50256"]) == 2
    err = capsys.readouterr().err
    assert "eos_token_id=50256 is not an id of the model's 100-id vocabulary" in err
    assert "--eos-token-id" in err and not (tmp_path / "out").exists()


def test_a_bad_token_ids_record_is_refused_naming_the_file(tmp_path):
    hf_decoder("qwen3", vocab=100).save_pretrained(tmp_path / "hf")
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "ep"), "--to", "epochal"]) == 0
    state = tmp_path / "ep" / "checkpoints" / "step_0000000" / "trainer_state.json"
    record = json.loads(state.read_text())
    record["token_ids"] = {"eos": "</s>"}
    state.write_text(json.dumps(record))
    (state.parent / MANIFEST).write_bytes(build_manifest(state.parent))  # a consistent folder
    with pytest.raises(ConversionError, match=r"trainer_state\.json: token_ids must map"):
        load_epochal_checkpoint(tmp_path / "ep")


def test_a_model_only_esm_checkpoint_exports_esm2s_ids(tmp_path):
    """A model-only ESM-2 checkpoint (no recorded ids) exports its alphabet's special ids:
    ``config.json``'s ids are those ``transformers``' tokenizer of the export reads."""
    from tests.train.finetune_data import pretrained_esm

    run = pretrained_esm(tmp_path / "esm")
    assert main(["convert", str(run), str(tmp_path / "hf"), "--to", "hf"]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert config["eos_token_id"] == tokenizer.eos_token_id
    assert config["pad_token_id"] == tokenizer.pad_token_id
    assert config["eos_token_id"] < config["vocab_size"]
