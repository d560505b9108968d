"""``epochal convert`` / ``epochal generate`` and epochal's own checkpoints (the trainer's DCP layout)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from epochal.cli import main
from epochal.convert.megatron.legacy import load_megatron_checkpoint
from epochal.formats.common import normalize_config
from epochal.formats.hf.io import load_hf_checkpoint
from epochal.model import GPTModel
from epochal.model.generation.decoding import generate
from epochal.train.config import config_from_dict, to_toml
from epochal.train.state.checkpoint import Checkpointer
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
from epochal.train.state.model_state import ModelState
from tests.convert.hf_models import as_read_from_hf, hf_gpt2, ours

RUN_CONFIG = {
    "data": {
        "data_path": ["/nonexistent/prefix"],
        "tokenizer_type": "ByteLevelTokenizer",
        "seq_length": 32,
    },
    "model": {
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "position_embedding_type": "rope",
        "normalization": "RMSNorm",
        "activation": "swiglu",
        "ffn_hidden_size": 64,
        "add_bias_linear": False,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    },
}


def trainer_checkpoint(run_dir: Path, step: int = 7) -> GPTModel:
    """Write a checkpoint exactly as the trainer does (Checkpointer + ModelState, config.toml
    without model.vocab_size: it comes from the ByteLevelTokenizer, 259 ids)."""
    from epochal.train.config import model_config_from_section

    cfg = config_from_dict({**RUN_CONFIG, "run_dir": str(run_dir)})
    model_cfg = model_config_from_section(cfg.model, vocab_size=259, seq_length=cfg.data.seq_length)
    model = ours(model_cfg, seed=4)
    Checkpointer(run_dir / "checkpoints").save(
        step,
        {"model": ModelState([model])},
        trainer_state={"format": 1, "step": step},
        rng_state={"cpu": torch.get_rng_state()},
        config_toml=to_toml(cfg),
    )
    return model


def test_trainer_checkpoint_reads_back(tmp_path):
    model = trainer_checkpoint(tmp_path / "run")
    for path in (
        tmp_path / "run",
        tmp_path / "run" / "checkpoints",
        tmp_path / "run" / "checkpoints" / "step_0000007",
    ):
        ck = load_epochal_checkpoint(path)
        assert ck.step == 7 and ck.config == model.config and ck.config.vocab_size == 259
        for name, tensor in model.state_dict().items():
            assert torch.equal(ck.state[name], tensor), name
    with pytest.raises(FileNotFoundError, match="no epochal checkpoint"):
        load_epochal_checkpoint(tmp_path)
    # the parallel layer's consolidated single-file export, kept in the step folder
    from epochal.train.parallel_trainer import export_consolidated

    step = tmp_path / "run" / "checkpoints" / "step_0000007"
    export_consolidated(step, step / "model.safetensors")
    ck = load_epochal_checkpoint(step / "model.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(ck.state[name], tensor), name


def test_convert_chain_keeps_weights_and_logits(tmp_path, capsys):
    pytest.importorskip("transformers")
    model = trainer_checkpoint(tmp_path / "run")
    assert (
        main(
            [
                "convert",
                str(tmp_path / "run"),
                str(tmp_path / "mg"),
                "--to",
                "megatron",
                "--tensor-parallel",
                "2",
                "--pipeline-parallel",
                "2",
            ]
        )
        == 0
    )
    assert "TP2 x PP2" in capsys.readouterr().out
    mg = load_megatron_checkpoint(tmp_path / "mg")
    assert mg.iteration == 7 and mg.config == normalize_config(model.config)
    assert (
        main(
            [
                "convert",
                str(tmp_path / "mg"),
                str(tmp_path / "hf"),
                "--to",
                "hf",
                "--eos-token-id",
                "256",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "epochal"]) == 0
    back = load_epochal_checkpoint(tmp_path / "back")
    assert back.config == as_read_from_hf(normalize_config(model.config))
    for name, tensor in model.state_dict().items():
        expected = tensor.clone()
        if name in ("tok_embeddings.weight", "output.weight"):
            expected[259:] = 0  # Hugging Face has no padded rows; they come back as zeros
        assert torch.equal(back.state[name], expected), name
    import transformers

    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 259, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens)[..., :259], rtol=0, atol=1e-5)
    # errors: exit status 2 and a message naming the problem
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "back"), "--to", "epochal"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "nothing"), str(tmp_path / "x"), "--to", "hf"]) == 2
    assert "nothing" in capsys.readouterr().err
    (tmp_path / "file").write_text("")  # an output that cannot be created: a message, no traceback
    assert (
        main(["convert", str(tmp_path / "hf"), str(tmp_path / "file" / "a" / "b"), "--to", "hf"])
        == 2
    )
    assert "file" in capsys.readouterr().err


def test_generate_cli_on_run_and_hf_folder(tmp_path, capsys):
    model = trainer_checkpoint(tmp_path / "run")
    out = tmp_path / "out.jsonl"
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(tmp_path / "run"),
                "--prompt",
                "def f(",
                "--prompt-ids",
                "1,2,3",
                "--max-new-tokens",
                "5",
                "--output",
                str(out),
                "--no-stop-at-eod",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "=== [0] def f(" in printed and "tokens/s" in printed
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["prompt_ids"] == list(b"def f(")  # the run's byte-level tokenizer
    expected = generate(model, [list(b"def f("), [1, 2, 3]], max_new_tokens=5).tokens
    assert [r["tokens"] for r in records] == expected
    assert records[1]["prompt"] is None and isinstance(records[0]["text"], str)

    pytest.importorskip("transformers")
    hf = hf_gpt2(seed=3)
    hf.save_pretrained(tmp_path / "hf")
    assert (
        main(
            [
                "generate",
                "--checkpoint",
                str(tmp_path / "hf"),
                "--prompt-ids",
                "5,6,7",
                "--num-beams",
                "3",
                "--num-return-sequences",
                "2",
                "--max-new-tokens",
                "4",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ours_model = GPTModel(load_hf_checkpoint(tmp_path / "hf").config)
    ours_model.load_state_dict(load_hf_checkpoint(tmp_path / "hf").state)
    want = generate(
        ours_model,
        [[5, 6, 7]],
        max_new_tokens=4,
        num_beams=3,
        num_return_sequences=2,
        stop_token_ids=(1,),
    )  # the HF config's eos_token_id
    assert [r["tokens"] for r in records] == want.tokens
    assert (
        main(
            ["generate", "--checkpoint", str(tmp_path / "hf"), "--prompt", "text needs a tokenizer"]
        )
        == 2
    )
    assert "no tokenizer" in capsys.readouterr().err


def test_convert_to_one_safetensors_file_for_inference(tmp_path, capsys):
    from safetensors.torch import load_file

    from epochal.parallel.checkpoint import load_consolidated

    model = trainer_checkpoint(tmp_path / "run")
    out = tmp_path / "export" / "tiny.safetensors"
    assert main(["convert", str(tmp_path / "run"), str(out), "--to", "safetensors"]) == 0
    assert f"safetensors:{out}" in capsys.readouterr().out
    # the parallel layer's consolidated format: every state-dict name (the tied head included)
    fresh = GPTModel(model.config)
    load_consolidated(out, fresh)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    # self-contained: away from its run, the file still gives the config, the step and the tokenizer
    moved = tmp_path / "elsewhere.safetensors"
    out.rename(moved)
    ck = load_epochal_checkpoint(moved)
    assert ck.config == model.config and ck.step == 7
    assert ck.run_config["data"]["tokenizer_type"] == "ByteLevelTokenizer"
    jsonl = tmp_path / "gen.jsonl"
    argv = ["generate", "--checkpoint", str(moved), "--prompt", "def f(", "--max-new-tokens", "3"]
    assert main([*argv, "--no-stop-at-eod", "--output", str(jsonl)]) == 0
    record = json.loads(jsonl.read_text())
    assert record["prompt_ids"] == list(b"def f(")
    assert [record["tokens"]] == generate(model, [list(b"def f(")], max_new_tokens=3).tokens
    # --dtype casts; an existing file is kept unless --overwrite; the name must say .safetensors
    capsys.readouterr()
    again = ["convert", str(tmp_path / "run"), str(moved), "--to", "safetensors"]
    assert main([*again, "--dtype", "bfloat16"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main([*again, "--dtype", "bfloat16", "--overwrite"]) == 0
    assert load_file(moved)["tok_embeddings.weight"].dtype == torch.bfloat16
    assert main([*again[:2], str(tmp_path / "x.pt"), "--to", "safetensors"]) == 2
    assert "x.pt" in capsys.readouterr().err and not (tmp_path / "x.pt").exists()


def test_generate_stops_at_the_hf_models_eos(tmp_path):
    """A Hugging Face folder's config.json ``eos_token_id`` (all of a list) wins over the
    end-of-document token guessed from its ``tokenizer.json``, as in ``transformers``."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    hf = hf_gpt2(seed=3)
    hf.save_pretrained(tmp_path / "hf")
    vocab = {f"t{i}": i for i in range(99)} | {"<|endoftext|>": 99}
    Tokenizer(WordLevel(vocab, unk_token="t0")).save(str(tmp_path / "hf" / "tokenizer.json"))
    model = GPTModel(load_hf_checkpoint(tmp_path / "hf").config)
    model.load_state_dict(load_hf_checkpoint(tmp_path / "hf").state)
    free = generate(model, [[5, 6, 7]], max_new_tokens=6).tokens[0]
    eos = free[1]  # a token greedy decoding reaches at step 2
    assert 99 not in free[:2] and eos not in free[:1]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["eos_token_id"] = [98, eos]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    # transformers reads generation_config.json's eos ids first, config.json's without it
    (tmp_path / "hf" / "generation_config.json").unlink(missing_ok=True)
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--checkpoint", str(tmp_path / "hf"), "--prompt-ids", "5,6,7"]
    assert main([*argv, "--max-new-tokens", "6", "--output", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["tokens"] == free[:2] and record["finished"]
    # and a conversion keeps the whole list
    assert main(["convert", str(tmp_path / "hf"), str(tmp_path / "hf2"), "--to", "hf"]) == 0
    assert json.loads((tmp_path / "hf2" / "config.json").read_text())["eos_token_id"] == [98, eos]


def test_generate_stops_at_generation_config_eos_as_transformers(tmp_path):
    """A Hugging Face folder's ``generation_config.json`` eos ids win over ``config.json``'s:
    the tokens are those of transformers' ``generate()`` of the folder."""
    transformers = pytest.importorskip("transformers")
    hf = hf_gpt2(seed=3)
    hf.save_pretrained(tmp_path / "hf")
    prompt = torch.tensor([[5, 6, 7]])
    free = hf.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=[98])[0, 3:]
    stop = int(free[1])
    assert stop not in free[:1].tolist()
    path = tmp_path / "hf" / "generation_config.json"
    generation = json.loads(path.read_text())
    path.write_text(json.dumps({**generation, "eos_token_id": [98, stop]}))
    peer = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    want = peer.generate(prompt, max_new_tokens=6, do_sample=False)[0, 3:].tolist()
    assert want == free[:2].tolist()
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--checkpoint", str(tmp_path / "hf"), "--prompt-ids", "5,6,7"]
    assert main([*argv, "--max-new-tokens", "6", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["tokens"] == want


def test_generate_relaunch_command_line_parses_back():
    import argparse

    from epochal.commands.generate import _argv, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["--checkpoint", "run", "--prompt", "a = -1", "--prompt", "b=2", "--prompt-ids", "1,2"]
    argv += ["--stop-token-id", "5", "--do-sample", "--top-p", "0.9", "--tensor-parallel", "2"]
    args = parser.parse_args(argv)
    rebuilt = _argv(args)
    assert rebuilt[0] == "generate"
    assert parser.parse_args(rebuilt[1:]) == args
