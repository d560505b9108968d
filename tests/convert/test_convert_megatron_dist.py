"""Peer tests: real Megatron-Core ``torch_dist`` checkpoints (``dist_checkpointing.save``) import.

A Megatron-Core ``GPTModel`` (Llama-style: RoPE, RMSNorm, SwiGLU, GQA; GPT-2-style:
learned positions, LayerNorm, GELU, tied head) saved at TP1 and TP2 in Megatron-LM's
layout (``iter_N`` + tracker, ``args`` in ``common.pt``) converts to our model with
Megatron's logits within 1e-5, and on to Hugging Face with the same logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from epochal.convert.megatron.legacy import load_megatron_checkpoint
from epochal.formats.common import ConversionError
from epochal.model import build_model
from tests.convert import mcore_dist_worker
from tests.dist_utils import run_gloo

pytestmark = [pytest.mark.peer, pytest.mark.distributed]
pytest.importorskip("megatron.core")
pytest.importorskip("psutil")  # Megatron-Core's dist_checkpointing needs it


def save_with_megatron(out: Path, tp: int, variant: str, load: Path | None = None) -> torch.Tensor:
    """Run the Megatron-Core worker on ``tp`` gloo ranks: save a model (or load ``load`` into a fresh one)."""
    out.mkdir(parents=True, exist_ok=True)
    vocab = 33 if variant.startswith("esm") else 100
    tokens = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, out / "tokens.pt")
    run_gloo(mcore_dist_worker.gloo_rank, tp, str(out), variant, str(load or ""), timeout=300)
    return tokens


# TP2 reading is also covered by the BERT TP2 import below: the TP2 GPT-2 save is slow tier
@pytest.fixture(
    scope="module",
    params=[(1, "llama"), pytest.param((2, "gpt2"), marks=pytest.mark.slow)],
    ids=["tp1-llama", "tp2-gpt2"],
)
def megatron_saved(request, tmp_path_factory) -> tuple[Path, torch.Tensor]:
    """A checkpoint saved by Megatron-Core (TP1 Llama-style, TP2 GPT-2-style) and its tokens."""
    out = tmp_path_factory.mktemp("mcore") / "ckpt"
    tp, variant = request.param
    return out, save_with_megatron(out, tp, variant)


def test_megatron_torch_dist_imports_with_megatrons_logits(tmp_path, megatron_saved):
    ckpt, tokens = megatron_saved
    reference = torch.load(ckpt / "logits.pt")
    for path in (ckpt, ckpt / "iter_0000007"):  # the checkpoints root or one iteration
        ck = load_megatron_checkpoint(path)
        assert ck.iteration == 7
        assert_imports_with_megatrons_logits(ck, tokens, reference, ckpt, tmp_path)


def assert_imports_with_megatrons_logits(ck, tokens, reference, ckpt, tmp_path) -> None:
    """``ck`` (a GPT) gives Megatron-Core's ``reference`` logits, and so does ``ckpt``
    converted on to Hugging Face through the CLI (format detected)."""
    assert ck.config.type == "gpt"
    model = build_model(ck.config).eval()
    model.load_state_dict(ck.state, strict=True)
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(ours[..., :100], reference[..., :100], atol=1e-5, rtol=1e-5)
    from epochal.cli import main

    hf_dir = tmp_path / "hf"
    if not hf_dir.exists():
        assert main(["convert", str(ckpt), str(hf_dir), "--to", "hf"]) == 0
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        theirs = hf(tokens).logits
    torch.testing.assert_close(theirs, reference[..., :100], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tp", "variant"), [pytest.param(1, "gpt2", marks=pytest.mark.slow), (2, "llama")]
)
def test_our_torch_dist_export_loads_into_megatron_core(tmp_path, tp, variant):
    """`epochal convert --to megatron --ckpt-format torch_dist` -> Megatron-Core's
    dist_checkpointing.load into a real GPTModel (TP1 / TP2): Megatron's logits are ours."""
    from epochal.convert.megatron.legacy import save_megatron_checkpoint
    from tests.convert.mcore_dist_worker import our_config

    config = our_config(variant)
    model = build_model(config, seed=4).eval()
    with torch.no_grad():  # non-trivial norms
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
    out = save_megatron_checkpoint(
        config, model.state_dict(), tmp_path / "mg", tensor_parallel=tp, ckpt_format="torch_dist"
    )
    assert (tmp_path / "mg" / "latest_checkpointed_iteration.txt").read_text().strip() == "0"
    tokens = save_with_megatron(tmp_path / "run", tp, variant, load=out)
    theirs = torch.load(tmp_path / "run" / "logits_loaded.pt")
    with torch.no_grad():
        ours = model(tokens)
    torch.testing.assert_close(theirs[..., :100], ours[..., :100], atol=1e-5, rtol=1e-5)
    back = load_megatron_checkpoint(tmp_path / "mg")  # and our reader gives the tensors back
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state[name], tensor), name


def test_missing_shards_and_args_are_named(tmp_path, megatron_saved):
    import shutil

    folder = tmp_path / "iter_0000007"
    shutil.copytree(megatron_saved[0] / "iter_0000007", folder)
    common = torch.load(folder / "common.pt", weights_only=False)
    torch.save({k: v for k, v in common.items() if k != "args"}, folder / "common.pt")
    with pytest.raises(ConversionError, match="no 'args'"):
        load_megatron_checkpoint(folder)
    victim = sorted(folder.glob("__*.distcp"))[-1]
    victim.unlink()
    with pytest.raises(ConversionError, match=f"shard files are missing.*{victim.name}"):
        load_megatron_checkpoint(folder)


def _our_bert_logits(model, tokens):
    from tests.convert.mcore_dist_worker import bert_inputs

    types, padding = bert_inputs(tokens)
    with torch.no_grad():
        if model.config.type == "esm":
            return model(tokens, padding_mask=padding), None, padding.bool()
        mlm, binary = model(tokens, token_types=types, padding_mask=padding)
    return mlm, binary, padding.bool()


def test_megatron_core_bert_torch_dist_tp2_imports_with_its_logits(tmp_path):
    """A real BertModel (encoder.* layers stacked, LM head, pooler, binary head) saved at TP2."""
    ckpt = tmp_path / "bert"
    tokens = save_with_megatron(ckpt, 2, "bert")
    ck = load_megatron_checkpoint(ckpt)
    assert ck.config.type == "bert" and ck.config.bert_binary_head and ck.iteration == 7
    model = build_model(ck.config).eval()
    model.load_state_dict(ck.state, strict=True)
    mlm, binary, real = _our_bert_logits(model, tokens)
    theirs = torch.load(ckpt / "logits.pt")
    assert mlm[..., :100].abs().max() > 1.0
    torch.testing.assert_close(mlm[real][:, :100], theirs[real][:, :100], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(binary, torch.load(ckpt / "binary.pt"), atol=1e-5, rtol=1e-5)
    with pytest.raises(ConversionError, match="holds a 'bert' model"):
        load_megatron_checkpoint(ckpt, model_type="gpt")


def test_our_bert_torch_dist_export_loads_into_megatron_core(tmp_path):
    from epochal.convert.megatron.legacy import save_megatron_checkpoint
    from tests.convert.hf_models import randomize
    from tests.convert.mcore_dist_worker import our_config

    config = our_config("bert")
    model = randomize(build_model(config), seed=6).eval()
    out = save_megatron_checkpoint(
        config, model.state_dict(), tmp_path / "mg", ckpt_format="torch_dist"
    )
    tokens = save_with_megatron(tmp_path / "run", 1, "bert", load=out)
    mlm, binary, real = _our_bert_logits(model, tokens)
    theirs = torch.load(tmp_path / "run" / "logits_loaded.pt")
    torch.testing.assert_close(theirs[real][:, :100], mlm[real][:, :100], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.load(tmp_path / "run" / "binary_loaded.pt"), binary)


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ("decoder.layers.self_attention.linear_q_down_proj.weight", "multi-latent attention"),
    ],
)
def test_unsupported_layers_are_named(tmp_path, key, what):
    import json

    from torch.distributed.checkpoint import FileSystemWriter, save

    folder = tmp_path / "iter_0000001"
    state = {key: torch.zeros(2, 4, 4), "embedding.word_embeddings.weight": torch.zeros(8, 4)}
    save(state, storage_writer=FileSystemWriter(str(folder)), no_dist=True)
    (folder / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    with pytest.raises(ConversionError, match=f"{what} \\('{key}'\\) are not supported"):
        load_megatron_checkpoint(folder)
