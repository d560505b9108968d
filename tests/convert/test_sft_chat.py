"""A fine-tuning run's chat template: ``epochal generate --chat`` and ``epochal convert --to hf``.

Expected values come from ``transformers``: its ``apply_chat_template`` of the run's
tokenizer folder, and ``generate()`` of the exported model with the exported
``generation_config.json``.
"""

from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.data.sft import load_chat_tokenizer, read_sft_rows, tokenize_sft_row
from epochal.data.sft.examples import TOKENIZER_DIR
from epochal.train.config import build_config
from epochal.train.state.encoder_init import finetune_overrides
from epochal.train.trainer import Trainer
from tests.data.sft.tiny_chat import tiny_llama
from tests.parallel import sft_worker as W

transformers = pytest.importorskip("transformers")

QUESTION = "What is two plus three?"


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A fine-tuning run from a Hugging Face folder (a random 2-layer ``transformers``
    Llama with the example chat tokenizer): 1 step at learning rate 0 on the example
    chat rows, a checkpoint at step 1. The random weights reply with varied tokens (a
    model trained for a few steps repeats one)."""
    root = tmp_path_factory.mktemp("sft_chat")
    base = root / "base"
    tiny_llama(len(load_chat_tokenizer(TOKENIZER_DIR)), seed=0).save_pretrained(base)
    for file in TOKENIZER_DIR.iterdir():
        shutil.copy(file, base / file.name)
    train = W.write_rows(root, 0, 24, "train.jsonl")
    init = f"--checkpoint.init_from={base}"
    overrides = [*finetune_overrides(None, [init]), init, f"--run_dir={root / 'run'}"]
    overrides += [f"--sft.train_file={train}", "--data.seq_length=80", "--training.device=cpu"]
    overrides += ["--training.micro_batch_size=4", "--training.global_batch_size=8"]
    overrides += ["--training.train_iters=1", "--checkpoint.save_interval=1"]
    overrides += ["--optimizer.lr=0", "--optimizer.min_lr=0", "--training.eval_iters=0"]
    Trainer(build_config(overrides=overrides), log=False).train()
    return root


@pytest.fixture(scope="module")
def hf_folder(sft_run):
    out = sft_run / "hf"
    assert cli_main(["convert", str(sft_run / "run"), str(out), "--to", "hf"]) == 0
    return out


@functools.cache
def _hf(folder):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return tok, transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def _reference(folder, messages, max_new_tokens, extra_eos=()):
    """transformers: the chat prompt's ids, greedy ``generate()`` with the folder's
    generation config (plus ``extra_eos``), the reply decoded without the stop token."""
    tok, model = _hf(str(folder))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    prompt = torch.tensor([ids["input_ids"]])
    eos = list(model.generation_config.eos_token_id) + list(extra_eos)
    with torch.no_grad():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=tok.pad_token_id,
        )
    new = out[0, prompt.shape[1] :].tolist()
    if new and new[-1] in eos:
        new = new[:-1]
    return new, tok.decode(new, skip_special_tokens=True)


def _ids(tokenizer, messages, add_generation_prompt=False):
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, return_dict=True
    )
    return list(out["input_ids"])


def test_export_keeps_the_chat_template_and_special_tokens(sft_run, hf_folder):
    """``AutoTokenizer`` of the exported folder renders every training conversation to the
    ids the run trained on, has the run tokenizer's special tokens, and the generation
    config stops at the token the template ends an assistant turn with."""
    run_tok = load_chat_tokenizer(sft_run / "base")  # the run's: checkpoint.init_from's
    exported = transformers.AutoTokenizer.from_pretrained(str(hf_folder))
    config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    assert config["chat_template"] == run_tok.chat_template
    for row in read_sft_rows(sft_run / "train.jsonl"):
        trained, _ = tokenize_sft_row(row, run_tok)
        messages = list(row.messages)
        assert _ids(exported, messages) == trained.tolist()
        prompt = messages[: next(i for i, m in enumerate(messages) if m["role"] == "assistant")]
        assert _ids(exported, prompt, True) == _ids(run_tok, prompt, True)
    for name in ("bos_token", "eos_token", "pad_token"):
        assert getattr(exported, name) == getattr(run_tok, name)
    hf_config = json.loads((hf_folder / "config.json").read_text())
    assert hf_config["eos_token_id"] == run_tok.eos_token_id
    assert hf_config["bos_token_id"] == run_tok.bos_token_id
    turn = _ids(run_tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "y"}])
    generation = transformers.GenerationConfig.from_pretrained(str(hf_folder))
    assert turn[-1] in generation.eos_token_id  # the template's end of an assistant turn
    chat = transformers.pipeline("text-generation", model=str(hf_folder), device="cpu")
    reply = chat([{"role": "user", "content": QUESTION}], max_new_tokens=4, do_sample=False)
    assert reply[0]["generated_text"][-1]["role"] == "assistant"


@pytest.mark.parametrize("source", ["run", "hf"])
def test_generate_chat_replies_as_transformers_generate(sft_run, hf_folder, capsys, source):
    """``epochal generate --chat`` of the run (and of its Hugging Face export) prints the
    reply transformers' greedy ``generate()`` gives on ``apply_chat_template``'s ids; a
    ``--stop`` token ends the reply where ``generate()`` with that eos id ends it."""
    checkpoint = sft_run / "run" if source == "run" else sft_run / "base"
    messages = [{"role": "user", "content": QUESTION}]
    free, expected = _reference(hf_folder, messages, 10)
    base = ["generate", "--checkpoint", str(checkpoint), "--chat", "--prompt", QUESTION]
    base += ["--max-new-tokens", "10", "--device", "cpu"]
    capsys.readouterr()
    assert cli_main(base) == 0
    assert capsys.readouterr().out == expected + "\n"
    # a stop token the free reply reaches after a few tokens
    k = next(k for k in range(2, len(free)) if free[k] not in free[:k])
    token = transformers.AutoTokenizer.from_pretrained(str(hf_folder)).convert_ids_to_tokens(
        free[k]
    )
    cut, expected = _reference(hf_folder, messages, 10, extra_eos=[free[k]])
    assert cut == free[:k]
    assert cli_main([*base, "--stop", token]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_generate_chat_with_a_system_message_and_several_prompts(sft_run, hf_folder, capsys):
    """``--system`` goes before each prompt; each reply follows its ``=== [i]`` line."""
    system = {"role": "system", "content": "Answer briefly."}
    questions = [QUESTION, "What color is snow?"]
    args = ["generate", "--checkpoint", str(sft_run / "run"), "--chat", "--device", "cpu"]
    args += ["--system", system["content"], "--max-new-tokens", "6"]
    for q in questions:
        args += ["--prompt", q]
    capsys.readouterr()
    assert cli_main(args) == 0
    lines = []
    for i, q in enumerate(questions):
        _, reply = _reference(hf_folder, [system, {"role": "user", "content": q}], 6)
        lines += [f"=== [{i}] {q}", reply]
    assert capsys.readouterr().out == "\n".join(lines) + "\n"


def test_generate_chat_errors_name_the_option(sft_run, hf_folder, tmp_path, capsys):
    """No chat template, token-id prompts, a ``--stop`` of several tokens: refused, named."""
    plain = tmp_path / "plain"
    shutil.copytree(hf_folder, plain)
    (plain / "chat_template.jinja").unlink()
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    base = ["generate", "--chat", "--device", "cpu", "--max-new-tokens", "2"]
    cases = [
        ([f"--checkpoint={plain}", "--prompt=hi"], "no chat template"),
        ([f"--checkpoint={sft_run / 'run'}", "--prompt-ids=1,2"], "--prompt-ids"),
        ([f"--checkpoint={sft_run / 'run'}", "--prompt=hi", "--stop=two plus"], "--stop"),
    ]
    for extra, text in cases:
        capsys.readouterr()
        assert cli_main([*base, *extra]) == 2
        assert text in capsys.readouterr().err


@pytest.mark.parametrize("source", ["run", "hf"])
def test_plain_generate_of_a_chat_model_stops_at_its_end_of_turn(
    sft_run, hf_folder, tmp_path, source
):
    """Plain ``epochal generate`` (no ``--chat``) of the run, and of its export, stops where
    transformers' greedy ``generate()`` stops with the export's ``generation_config.json``
    eos ids: at the end-of-turn token, not past it."""
    tok, model = _hf(str(hf_folder))
    eos = list(model.generation_config.eos_token_id)
    prompts = torch.arange(len(tok.all_special_ids), model.config.vocab_size)[:, None]
    with torch.no_grad():  # the first one-token prompt whose free continuation passes an eos id
        free = model.generate(
            prompts, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    free = free[:, 1:].tolist()
    i = next(i for i, f in enumerate(free) if any(t in eos for t in f[:-1]))
    prompt = int(prompts[i, 0])
    with torch.no_grad():
        want = model.generate(
            prompts[i : i + 1], max_new_tokens=12, do_sample=False, eos_token_id=eos
        )
    want = want[0, 1:].tolist()
    assert want[-1] in eos and len(want) < 12
    checkpoint = sft_run / "run" if source == "run" else hf_folder
    out = tmp_path / "out.jsonl"
    args = ["generate", "--checkpoint", str(checkpoint), f"--prompt-ids={prompt}"]
    args += ["--max-new-tokens", "12", "--device", "cpu", "--output", str(out)]
    assert cli_main(args) == 0
    assert json.loads(out.read_text())["tokens"] == want
