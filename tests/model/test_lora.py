"""LoRA: adapters start as no change, only adapters and head train, merging is exact, exports work."""

from __future__ import annotations

import pytest
import torch

from epochal.cli import main as cli_main
from epochal.model import build_model
from epochal.model.config import ConfigError, ModelConfig
from epochal.model.lora import LoRALinear, merge_lora_state
from tests.model.test_heads import BASE as HEADS_BASE
from tests.train import finetune_data as D

BASE = {**HEADS_BASE, "head": "residue_classification", "num_labels": 3}
LORA = dict(lora_rank=4, lora_alpha=8.0, lora_target_modules="wq,wv,fc2")


def test_fresh_adapters_change_nothing_and_are_the_only_trainable_encoder_part():
    plain = build_model(ModelConfig(**BASE), seed=1).eval()
    lora = build_model(ModelConfig(**BASE, **LORA), seed=1).eval()
    assert isinstance(lora.layers["0"].attention.wq, LoRALinear)
    assert not isinstance(lora.layers["0"].attention.wk, LoRALinear)
    tokens = torch.randint(4, 24, (2, 10))
    assert torch.allclose(plain(tokens), lora(tokens), atol=1e-6)
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all(
        n.startswith("head.") or n.endswith(("lora_a", "lora_b")) for n in trainable
    )
    assert {n for n in trainable if n.endswith("lora_b")} == {
        f"layers.{i}.{m}.lora_b"
        for i in range(2)
        for m in ("attention.wq", "attention.wv", "mlp.fc2")
    }


def test_merged_model_logits_equal_adapter_model_logits():
    config = ModelConfig(**BASE, **LORA)
    lora = build_model(config, seed=2).eval()
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    merged_state = merge_lora_state(lora.state_dict(), config)
    plain = build_model(ModelConfig(**BASE), seed=0).eval()
    plain.load_state_dict(merged_state, strict=True)
    tokens = torch.randint(4, 24, (3, 12))
    assert not torch.allclose(
        lora(tokens), build_model(ModelConfig(**BASE), seed=2).eval()(tokens), atol=1e-4
    )
    assert torch.allclose(plain(tokens), lora(tokens), atol=1e-5)


def test_lora_under_tensor_parallelism_is_refused():
    from epochal.parallel.dims import ParallelDims
    from epochal.parallel.model_support import check_model_layout

    dims = ParallelDims(tp=2, pp=1, dp=1)
    with pytest.raises(ConfigError, match="LoRA"):
        check_model_layout(ModelConfig(**BASE, **LORA), dims)


def test_lora_run_trains_adapters_and_exports_merged(tmp_path):
    from safetensors.torch import load_file

    from epochal.train.config import build_config
    from epochal.train.state.encoder_init import finetune_overrides, read_encoder
    from epochal.train.trainer import Trainer

    init = D.pretrained_esm(tmp_path / "pre")
    table = D.write_table(tmp_path / "t.csv", "residue_classification", 16, 1)
    args = D.finetune_args(tmp_path / "run", init, table, None, "residue_classification", 2)
    args += [
        "--model.lora_rank=4",
        "--model.lora_alpha=8",
        "--checkpoint.save_final=true",
        "--optimizer.lr=0.05",
    ]
    trainer = Trainer(
        build_config(preset=None, overrides=[*finetune_overrides(None, args), *args]), log=False
    )
    trainer.train()
    _, pretrained, _ = read_encoder(init)
    for name, value in trainer.model_parts[0].state_dict().items():
        if name in pretrained and not name.startswith("head."):
            assert torch.equal(value, pretrained[name]), name  # the encoder stays frozen
    assert any(
        not torch.all(v == 0)
        for n, v in trainer.model_parts[0].state_dict().items()
        if n.endswith("lora_b")
    )
    # merged plain checkpoint: the same predictions as the adapter model
    assert (
        cli_main(
            [
                "convert",
                str(tmp_path / "run"),
                str(tmp_path / "merged"),
                "--to",
                "epochal",
            ]
        )
        == 0
    )
    outs = {}
    for name in ("run", "merged"):
        out = tmp_path / f"{name}.safetensors"
        assert D.embed(str(tmp_path / name), str(table), str(out), "--predictions") == 0
        outs[name] = load_file(out)
    assert torch.allclose(outs["run"]["predictions"], outs["merged"]["predictions"], atol=1e-5)
    assert torch.allclose(outs["run"]["embeddings"], outs["merged"]["embeddings"], atol=1e-5)
    merged_config, merged_state, _ = read_encoder(tmp_path / "merged")
    assert merged_config.lora_rank == 0 and not any("lora" in k for k in merged_state)
    # Hugging Face: the merged encoder as a bare EsmModel, the head next to it
    transformers = pytest.importorskip("transformers")
    hf = tmp_path / "hf"
    assert cli_main(["convert", str(tmp_path / "run"), str(hf), "--to", "hf"]) == 0
    assert (hf / "epochal_head.safetensors").is_file()
    model = transformers.EsmModel.from_pretrained(hf, add_pooling_layer=False).eval()
    tokens = torch.tensor([[0, 20, 15, 11, 5, 19, 2]])  # <cls> M K T A Y <eos>
    with torch.no_grad():
        theirs = model(input_ids=tokens).last_hidden_state[0, 1:-1].mean(0)
    run = read_encoder(tmp_path / "run")
    lora_model = build_model(run[0]).eval()
    lora_model.load_state_dict(run[1], strict=False)
    ours = lora_model.encode(tokens)[0, 1:-1].mean(0)
    assert torch.allclose(theirs, ours, atol=1e-5)
