"""``accelerator.prepare`` in one process: the transformers model's losses, the user's optimizer, exact resume.

Peers: Hugging Face Accelerate runs the same script without Megatron (its losses
are transformers' own); transformers computes the reference losses and logits.
"""

import copy
import math
import os
import subprocess
import sys

import pytest
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import default_data_collator

from epochal.accelerate import Accelerator, set_seed
from epochal.accelerate.utils import MegatronLMDummyScheduler, MegatronLMPlugin
from tests.accelerate import guide_script
from tests.accelerate.conftest import MEGATRON, TASKS, blocks, run_in_process, tiny_gpt2


@pytest.mark.parametrize("model", ["gpt2", "llama", "t5"])
def test_eval_loss_equals_accelerate_without_megatron(one_process, tmp_path, model):
    """At learning rate 0 the script prints the eval_loss that Accelerate's plain backend prints."""
    frozen = ["--learning_rate", "0", "--max_train_steps", "1"]
    ours = one_process(model, 1, *frozen)
    peer = run_in_process(
        [*TASKS[model], *frozen, "--backend", "accelerate"], tmp_path / "peer.json"
    )
    assert math.isclose(ours["eval_loss"], peer["eval_loss"], abs_tol=1e-5), (ours, peer)


def _groups(model: torch.nn.Module, decay: float) -> list[dict]:
    named = list(model.named_parameters())
    return [
        {
            "params": [p for n, p in named if "ln_" not in n and "bias" not in n],
            "weight_decay": decay,
        },
        {
            "params": [p for n, p in named if "ln_" in n or "bias" in n],
            "weight_decay": 0.0,
            "lr": 5e-3,
        },
    ]


def test_training_follows_the_users_optimizer_and_transformers_loss():
    """Steps equal plain PyTorch training of the transformers model with the same AdamW groups."""
    set_seed(0)
    model = tiny_gpt2()
    reference = copy.deepcopy(model)
    data = blocks(12)
    optimizer = torch.optim.AdamW(_groups(model, 0.1), lr=1e-2, betas=(0.8, 0.95), eps=1e-6)
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(gradient_clipping=0.5))
    scheduler = MegatronLMDummyScheduler(optimizer, total_num_steps=10, warmup_num_steps=2)
    loader = DataLoader(data, batch_size=4, collate_fn=default_data_collator)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    ours = [model(**batch).loss.item() for batch in loader]

    ref_opt = torch.optim.AdamW(_groups(reference, 0.1), lr=1e-2, betas=(0.8, 0.95), eps=1e-6)
    peaks = [g["lr"] for g in ref_opt.param_groups]
    theirs = []
    for step, batch in enumerate(DataLoader(data, batch_size=4, collate_fn=default_data_collator)):
        scale = (
            step / 2 if step < 2 else 1 - (step - 2) / 8
        )  # Megatron: linear warmup, linear decay
        for group, peak in zip(ref_opt.param_groups, peaks):
            group["lr"] = peak * scale
        loss = reference(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        theirs.append(loss.item())
    assert ours == pytest.approx(theirs, abs=1e-5)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    state = accelerator.unwrap_model(model).state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.allclose(state[name], tensor, atol=1e-5), name


def _encoder(kind: str) -> transformers.PreTrainedModel:
    common = dict(
        num_hidden_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    if kind == "bert":
        return transformers.BertForMaskedLM(
            transformers.BertConfig(max_position_embeddings=16, vocab_size=99, **common)
        )
    config = transformers.EsmConfig(
        vocab_size=33,
        max_position_embeddings=18,
        pad_token_id=1,
        mask_token_id=32,
        position_embedding_type="rotary",
        token_dropout=True,
        **common,
    )
    return transformers.EsmForMaskedLM(config)


@pytest.mark.parametrize("kind", ["bert", "esm"])
def test_mlm_loss_and_unwrapped_model_are_transformers(tmp_path, kind):
    """The masked-LM loss equals transformers'; save_pretrained gives equal logits."""
    set_seed(1)
    model = _encoder(kind)
    reference = copy.deepcopy(model).eval()
    vocab, mask_id = (99, 4) if kind == "bert" else (24, 32)
    g = torch.Generator().manual_seed(5)
    data = []
    for _ in range(4):
        ids = torch.randint(5, vocab, (16,), generator=g)
        labels = torch.where(torch.rand(16, generator=g) < 0.3, ids, torch.full_like(ids, -100))
        ids = torch.where(labels != -100, torch.full_like(ids, mask_id), ids)
        mask = torch.ones(16, dtype=torch.long)
        mask[12:] = 0
        labels[12:] = -100
        data.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    accelerator = Accelerator(megatron_lm_plugin=MegatronLMPlugin(return_logits=True))
    model, loader = accelerator.prepare(
        model, DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    )
    model.eval()
    for batch in loader:
        ours = model(**batch)
        theirs = reference(**batch)
        assert math.isclose(ours.loss.item(), theirs.loss.item(), abs_tol=1e-5)
        assert torch.allclose(ours.logits, theirs.logits, atol=1e-5)
    accelerator.unwrap_model(model).save_pretrained(tmp_path / "hf")
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    batch = default_data_collator(data[:2])
    assert torch.allclose(loaded(**batch).logits, reference(**batch).logits, atol=1e-5)


def test_guide_custom_train_step(tmp_path):
    """The guide's GPTTrainStepWithCustomLoss (set on the plugin as in its main()) weighs keyword samples."""
    from tests.train.accelerate_custom_loss import GPTTrainStepWithCustomLoss

    set_seed(2)
    model = tiny_gpt2()
    reference = copy.deepcopy(model).eval()
    data = blocks(4)
    accelerator = Accelerator()
    keytoken_ids = [int(data[0]["input_ids"][3]), int(data[1]["input_ids"][5])]
    accelerator.state.megatron_lm_plugin.custom_train_step_class = GPTTrainStepWithCustomLoss
    accelerator.state.megatron_lm_plugin.custom_train_step_kwargs = {
        "keytoken_ids": keytoken_ids,
        "alpha": 0.25,
    }
    model, loader = accelerator.prepare(
        model, DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    )
    model.eval()
    for batch in loader:
        logits = reference(**batch).logits[:, :-1]
        targets = batch["labels"][:, 1:]
        per_token = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), targets, reduction="none"
        )
        weights = 1 + 0.25 * sum((batch["input_ids"] == k).float() for k in keytoken_ids).sum(1)
        expected = (per_token.mean(1) * weights).mean()
        assert math.isclose(model(**batch).loss.item(), expected.item(), abs_tol=1e-5)


def test_save_kill_load_continues_bit_for_bit(one_process, tmp_path):
    """save_state, SIGKILL, load_state: the resumed steps are the uninterrupted run's, bit for bit."""
    uninterrupted = one_process("gpt2")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    env.update(MEGATRON, OMP_NUM_THREADS=str(torch.get_num_threads()))
    script = guide_script.__file__
    argv = [
        *TASKS["gpt2"],
        "--checkpointing_steps",
        "2",
        "--kill_after_save",
        "--output_dir",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, script, *argv], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr
    resumed = run_in_process(
        [
            *TASKS["gpt2"],
            "--resume_from_checkpoint",
            str(tmp_path / "step_2"),
            "--output_dir",
            str(tmp_path),
        ],
        tmp_path / "resumed.json",
    )
    assert resumed["train_losses"] == uninterrupted["train_losses"][2:]
    assert resumed["eval_loss"] == uninterrupted["eval_loss"]
    assert resumed["consumed_samples"] == uninterrupted["consumed_samples"]
