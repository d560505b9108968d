"""``epochal convert --to hf`` of a fine-tuning run whose tokenizer folder is gone.

The run (1 step of the ``sft-tiny`` shape) tokenized its rows with a copy of the example
chat tokenizer named by ``sft.tokenizer``; the copy is then deleted. The export refuses
before writing anything; ``--tokenizer DIR`` ships another folder (what ``transformers``'
``AutoTokenizer`` then reads back is that folder's tokenizer) and ``--no-tokenizer`` ships
none.
"""

from __future__ import annotations

import json
import shutil

import pytest

from epochal.cli import main
from epochal.data.sft.examples import TOKENIZER_DIR
from epochal.train.trainer import Trainer
from tests.parallel import sft_worker as W

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_gone")
    tokenizer = root / "tokenizer"
    shutil.copytree(TOKENIZER_DIR, tokenizer)
    train = W.write_rows(root, 0, 8, "train.jsonl")
    extra = [f"--sft.tokenizer={tokenizer}", f"--sft.train_file={train}", "--sft.split="]
    extra += ["--training.micro_batch_size=4", "--training.global_batch_size=4"]
    extra += ["--training.train_iters=1", "--checkpoint.save_interval=1"]
    Trainer(W.config(str(root / "run"), extra), log=False).train()
    shutil.rmtree(tokenizer)
    return root


def _convert(run, out, *options: str) -> int:
    return main(["convert", str(run / "run"), str(out), "--to", "hf", *options])


def test_the_export_is_refused_naming_the_folder_and_the_ways_on(run, tmp_path, capsys):
    assert _convert(run, tmp_path / "hf") == 2
    err = capsys.readouterr().err
    assert f"the run's tokenizer folder {run / 'tokenizer'} (sft.tokenizer) is gone" in err
    assert "--tokenizer DIR" in err and "--no-tokenizer" in err
    assert not (tmp_path / "hf").exists()


def test_another_tokenizer_folder_ships_with_the_weights(run, tmp_path):
    assert _convert(run, tmp_path / "hf", "--tokenizer", str(TOKENIZER_DIR)) == 0
    want = transformers.AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    got = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    messages = [{"role": "user", "content": "What is two plus three?"}]
    assert got.apply_chat_template(messages) == want.apply_chat_template(messages)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "hf")
    assert config.eos_token_id == want.eos_token_id
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert want.eos_token_id in generation["eos_token_id"]


def test_no_tokenizer_exports_the_weights_alone(run, tmp_path):
    assert _convert(run, tmp_path / "hf", "--no-tokenizer") == 0
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    # the options are Hugging Face output options
    epochal = ["convert", str(run / "run"), str(tmp_path / "ep"), "--to", "epochal"]
    assert main([*epochal, "--no-tokenizer"]) == 2
