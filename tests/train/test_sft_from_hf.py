"""A preset's values give way to explicit options, and fine-tuning a Hugging Face folder is one command.

``epochal train --sft.train_file=ROWS --checkpoint.init_from=FOLDER`` takes the model and
the tokenizer from the folder (as TRL's ``SFTTrainer(model=...)`` does); with
``--preset sft-tiny`` the preset's model, tokenizer and split give way to what the
command names. Expected values come from ``transformers``: the folder's
``config.json`` read by ``AutoConfig``, its tokenizer, and the logits of the
``AutoModelForCausalLM`` it holds.
"""

from __future__ import annotations

import shutil
import tomllib

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.data.sft import load_chat_tokenizer
from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.train.config import build_config, config_from_saved
from epochal.train.state.checkpoint import CheckpointError
from epochal.train.state.encoder_init import finetune_overrides
from epochal.train.trainer import Trainer
from tests.data.sft.tiny_chat import tiny_llama
from tests.parallel import sft_worker as W

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.peer

QUICK = [
    "--training.device=cpu",
    "--training.train_iters=1",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A random 2-layer ``transformers`` Llama (hidden 64, intermediate 128: the default
    width of a 64-wide SwiGLU) with the example chat tokenizer, one of 300 ids without a
    tokenizer, training rows, the one-command run from the first and its export."""
    root = tmp_path_factory.mktemp("sft_hf")
    llama = root / "llama"
    tiny_llama(len(load_chat_tokenizer(TOKENIZER_DIR)), seed=1).save_pretrained(llama)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, llama / file.name)
    tiny_llama(300, seed=2).save_pretrained(root / "bare")
    rows = W.write_rows(root, 0, 24, "rows.jsonl")
    return {"root": root, "llama": llama, "bare": root / "bare", "rows": rows}


@pytest.fixture(scope="module")
def one_command(folders):
    """``epochal train --sft.train_file=ROWS --checkpoint.init_from=FOLDER`` (1 step), then
    ``epochal convert`` of the run to a Hugging Face folder."""
    run = folders["root"] / "run"
    init = f"--checkpoint.init_from={folders['llama']}"
    args = ["train", f"--sft.train_file={folders['rows']}", init, f"--run_dir={run}", *QUICK]
    assert cli_main(args) == 0
    export = folders["root"] / "export"
    assert cli_main(["convert", str(run), str(export), "--to", "hf"]) == 0
    return {"run": run, "export": export}


def test_an_explicit_valid_file_replaces_the_presets_split():
    overrides = [f"--sft.valid_file={CHAT_FILE}"]
    cfg = build_config(preset="sft-tiny", overrides=overrides)
    assert cfg.sft.valid_file == str(CHAT_FILE) and cfg.sft.split == ""
    notes: list[str] = []
    build_config(preset="sft-tiny", overrides=overrides, log=notes.append)
    assert notes == [
        "preset sft-tiny's values give way to the options given: "
        'sft.split = "90,10" (sft.valid_file is set)'
    ]


def test_one_command_fine_tunes_a_hugging_face_folder(folders, one_command, capsys):
    """The folder's model (``AutoConfig``), weights and tokenizer; the sequence length cut
    to the folder's positions."""
    saved = tomllib.loads((one_command["run"] / "config.toml").read_text())
    hf = transformers.AutoConfig.from_pretrained(folders["llama"])
    model = saved["model"]
    assert (model["hidden_size"], model["num_layers"]) == (hf.hidden_size, hf.num_hidden_layers)
    assert (
        model["vocab_size"]
        == hf.vocab_size
        == len(transformers.AutoTokenizer.from_pretrained(folders["llama"]))
    )
    assert saved["data"]["seq_length"] == hf.max_position_embeddings
    assert saved["data"]["tokenizer_model"] == str(folders["llama"])  # the folder's tokenizer
    assert saved["sft"].get("tokenizer", "") == ""


def test_the_sft_tiny_preset_gives_way_to_an_exported_folder(one_command, capsys):
    """``--preset sft-tiny --checkpoint.init_from=EXPORT``: the export's model (its
    ``intermediate_size`` 128 read back as the default width) loads, and gives the logits
    ``transformers`` gives; the export's tokenizer replaces the preset's, said in one note."""
    export = one_command["export"]
    args = ["train", "--preset", "sft-tiny", f"--checkpoint.init_from={export}", "--print-config"]
    assert cli_main(args) == 0
    out = capsys.readouterr()
    [note] = [line for line in out.err.splitlines() if "give way" in line]
    assert "[model]" in note and f'sft.tokenizer = "{TOKENIZER_DIR}"' in note
    values = tomllib.loads(out.out)
    assert values["sft"].get("tokenizer", "") == "" and values["sft"]["split"] == "90,10"
    values["run_dir"] = str(one_command["run"].parent / "preset")
    values["training"]["device"] = "cpu"
    tr = Trainer(config_from_saved(values), log=False)
    tr.init_from_checkpoint(tr.find_checkpoint(export, "init_from"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(export).eval()
    assert tr.model_config.ffn_size == hf.config.intermediate_size
    tokens = torch.randint(
        0, hf.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = hf(tokens).logits
        got = tr.model_parts[0].eval()(tokens)[..., : hf.config.vocab_size]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_a_model_option_equal_to_the_folders_is_accepted(one_command):
    """``--model.ffn_hidden_size=128`` is the export's width (spelled out); 256 is another model."""
    init = f"--checkpoint.init_from={one_command['export']}"
    assert finetune_overrides(None, [init, "--model.ffn_hidden_size=128"]) is not None
    with pytest.raises(
        CheckpointError, match=r"model\.ffn_hidden_size=256 \(the folder's is 128\)"
    ):
        finetune_overrides(None, [init, "--model.ffn_hidden_size=256"])


def test_a_vocabulary_error_names_where_the_tokenizer_comes_from(folders, tmp_path, capsys):
    """A folder of 300 ids with the preset's 512-id tokenizer: the error names sft.tokenizer."""
    init = f"--checkpoint.init_from={folders['bare']}"
    args = ["train", "--preset", "sft-tiny", init, f"--run_dir={tmp_path / 'run'}", *QUICK]
    assert cli_main(args) == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("epochal train: error: model.vocab_size: ")
    assert "512" in error and "got 300" in error and str(folders["bare"]) in error
    assert f"sft.tokenizer={str(TOKENIZER_DIR)!r}" in error
