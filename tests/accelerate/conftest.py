"""Runs of ``guide_script.py`` in the test process, shared by the tests of this folder (cached)."""

import json
import os
from pathlib import Path

import pytest
import torch
import transformers

from tests.accelerate import guide_script

#: the script's arguments per model, as every test here runs them
TASKS = {
    "gpt2": ["--task", "clm", "--model_type", "gpt2", "--max_train_steps", "4"],
    "llama": ["--task", "clm", "--model_type", "llama", "--max_train_steps", "2"],
    "bert": ["--task", "mlm", "--max_train_steps", "2"],
    "t5": ["--task", "seq2seq", "--max_train_steps", "2"],
}


#: what ``accelerate launch`` sets for a Megatron-LM configuration (the guide's script's)
MEGATRON = {"ACCELERATE_USE_MEGATRON_LM": "true"}


def run_in_process(argv: list[str], report: Path, env: dict[str, str] | None = None) -> dict:
    """``guide_script.main(argv)`` in this process with ``MEGATRON_LM_*`` = ``env``; its report.

    The epochal backend runs as under a Megatron-LM configuration (:data:`MEGATRON`: its
    train step clips at the plugin's default), as ``epochal launch`` runs the script with
    the layouts' YAML files.
    """
    saved = {k: v for k, v in os.environ.items() if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    for key in saved:
        del os.environ[key]
    backend = argv[argv.index("--backend") + 1] if "--backend" in argv else "epochal"
    if backend == "epochal":
        os.environ.update(MEGATRON)
    os.environ.update(env or {})
    try:
        guide_script.main([*argv, "--report", str(report)])
    finally:
        for key in [k for k in os.environ if k.startswith(("MEGATRON_LM_", "ACCELERATE_"))]:
            del os.environ[key]
        os.environ.update(saved)
    return json.loads(report.read_text())


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """``one_process(model, micro_batches=1, *extra)``: a cached one-process epochal run's report."""
    cache: dict[tuple, dict] = {}
    folder = tmp_path_factory.mktemp("one_process")

    def get(model: str, micro_batches: int = 1, *extra: str) -> dict:
        key = (model, micro_batches, *extra)
        if key not in cache:
            env = {"MEGATRON_LM_NUM_MICRO_BATCHES": str(micro_batches)}
            report = folder / f"{'_'.join(map(str, key)).replace('-', '')}.json"
            cache[key] = run_in_process([*TASKS[model], *extra], report, env)
        return cache[key]

    return get


def tiny_gpt2(
    vocab: int = 101, layers: int = 2, positions: int = 16
) -> transformers.GPT2LMHeadModel:
    """A GPT-2 of ``layers`` layers, hidden 32, no dropout (every layout computes the same)."""
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=32,
        n_head=4,
        n_positions=positions,
        vocab_size=vocab,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


def blocks(n: int, length: int = 16, vocab: int = 101) -> list[dict[str, torch.Tensor]]:
    """``n`` causal-LM samples of ``length`` random ids (``labels`` = ``input_ids``)."""
    ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(3))
    return [{"input_ids": r, "labels": r.clone()} for r in ids]
