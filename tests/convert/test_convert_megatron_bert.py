"""Megatron-LM legacy BERT checkpoints: round trips at any TP x PP, names, refusals, the CLI.

The logits against the real Megatron-Core ``BertModel`` are in
``test_convert_megatron_bert_peer.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from epochal.cli import main
from epochal.convert.megatron.layout import megatron_model_type
from epochal.convert.megatron.legacy import (
    TRACKER_FILE,
    load_megatron_checkpoint,
    save_megatron_checkpoint,
)
from epochal.formats.common import ConversionError
from epochal.formats.safe_load import safe_torch_load
from epochal.model import build_model
from epochal.train.state.epochal_ckpt import load_epochal_checkpoint, save_epochal_checkpoint
from tests.convert.hf_models import encoder_like, gpt2_like, ours, randomize
from tests.convert.megatron_names import legacy_language_model


def bert(binary: bool = True, **kw):
    cfg = encoder_like(bert_binary_head=binary, make_vocab_size_divisible_by=8, **kw)
    return cfg, randomize(build_model(cfg), seed=3).state_dict()


def rank_file(root, tp: int, pp: int | None, iteration: int = 0):
    name = f"mp_rank_{tp:02d}" if pp is None else f"mp_rank_{tp:02d}_{pp:03d}"
    return root / f"iter_{iteration:07d}" / name / "model_optim_rng.pt"


def assert_same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize(
    ("tp", "pp", "spec", "binary", "tokentypes"),
    [
        (1, 1, "local", True, 2),
        (2, 1, "transformer_engine", True, 2),
        (1, 2, "local", False, 0),
        (2, 2, "transformer_engine", False, 2),
    ],
)
def test_round_trip_any_tp_pp_is_lossless(tmp_path, tp, pp, spec, binary, tokentypes):
    cfg, state = bert(binary, num_tokentypes=tokentypes)
    save_megatron_checkpoint(
        cfg, state, tmp_path, tensor_parallel=tp, pipeline_parallel=pp, spec=spec, iteration=4
    )
    back = load_megatron_checkpoint(tmp_path, model_type="bert")
    assert (back.tensor_parallel, back.pipeline_parallel, back.iteration) == (tp, pp, 4)
    assert back.config == cfg
    assert_same_state(back.state, state)
    assert back.args.bert_binary_head is binary and back.args.num_tokentypes == tokentypes


def test_rank_files_hold_megatron_core_bert_names_and_shards(tmp_path):
    cfg, state = bert(True)
    save_megatron_checkpoint(cfg, state, tmp_path, tensor_parallel=2, pipeline_parallel=2)
    first = safe_torch_load(rank_file(tmp_path, 1, 0))["model"]
    last = safe_torch_load(rank_file(tmp_path, 1, 1))["model"]
    padded = safe_torch_load(rank_file(tmp_path, 0, 0))["args"].padded_vocab_size
    assert padded == 112  # 100 rounded up to a multiple of 8 x TP 2
    # the first stage: embeddings (word embeddings vocabulary-parallel) and layer 0
    assert first["embedding.word_embeddings.weight"].shape == (padded // 2, cfg.hidden_size)
    assert torch.equal(
        first["embedding.tokentype_embeddings.weight"], state["tokentype_embeddings.weight"]
    )
    assert "encoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in first
    assert not any(n.startswith(("decoder.", "lm_head.", "output_layer.")) for n in first)
    # the last stage: layer 1 as local layer 0, final norm, the heads; output_layer.bias is
    # vocabulary-parallel, the tied embedding's synced copy is there, the rest replicated
    assert torch.equal(last["encoder.final_layernorm.weight"], state["norm.weight"])
    vocab_bias = torch.cat([state["lm_head.bias"], torch.zeros(padded - 104)])
    assert torch.equal(last["output_layer.bias"], vocab_bias[padded // 2 :])
    word = torch.cat([state["tok_embeddings.weight"], torch.zeros(padded - 104, 32)])
    assert torch.equal(last["output_layer.weight"], word[padded // 2 :])
    for ours_name, theirs in (
        ("lm_head.dense.weight", "lm_head.dense.weight"),
        ("lm_head.norm.weight", "lm_head.layer_norm.weight"),
        ("pooler.dense.bias", "pooler.dense.bias"),
        ("binary_head.weight", "binary_head.weight"),
    ):
        assert torch.equal(last[theirs], state[ours_name]), theirs
    assert "encoder.layers.0.mlp.linear_fc1.weight" in last
    assert "encoder.layers.1.mlp.linear_fc1.weight" not in last
    assert last["output_layer._extra_state"] is None


def _legacy_bert_names(state: dict) -> dict:
    """One rank of Megatron-Core BertModel names -> the legacy (non-core) BertModel's names."""
    lm, rest = legacy_language_model(state, "encoder")
    out: dict = {"language_model": lm}
    for name, value in rest.items():
        if name.startswith("pooler."):
            lm.setdefault("pooler", {})[name[len("pooler.") :]] = value
        elif name == "output_layer.bias":
            out.setdefault("lm_head", {})["bias"] = value
        elif name.startswith("lm_head.layer_norm."):
            out.setdefault("lm_head", {})[name.replace("lm_head.layer_norm.", "layernorm.")] = value
        elif name.startswith(("lm_head.", "binary_head.")):
            module, _, param = name.partition(".")
            out.setdefault(module, {})[param] = value
        elif name == "output_layer.weight":
            out["word_embeddings_for_head"] = {"weight": value}
    return out


def test_legacy_bert_names_import(tmp_path):
    cfg, state = bert(True)
    save_megatron_checkpoint(cfg, state, tmp_path / "mcore", pipeline_parallel=2, spec="local")
    for p in range(2):
        path = rank_file(tmp_path / "mcore", 0, p)
        payload = safe_torch_load(path)
        payload["model"] = _legacy_bert_names(payload["model"])
        payload["args"].use_mcore_models = False
        torch.save(payload, path)
    first = safe_torch_load(rank_file(tmp_path / "mcore", 0, 0))["model"]
    assert "encoder" in first["language_model"] and "lm_head" not in first
    back = load_megatron_checkpoint(tmp_path / "mcore", model_type="bert")
    assert back.config == cfg
    assert_same_state(back.state, state)


def test_model_type_comes_from_the_tensors():
    assert megatron_model_type(["decoder.layers.0.mlp.linear_fc1.weight"]) == "gpt"
    assert megatron_model_type(["language_model.encoder.layers.0.mlp.dense_h_to_4h.weight"]) == (
        "gpt"
    )
    assert megatron_model_type(["encoder.layers.0.mlp.linear_fc1.weight"]) == "bert"
    assert megatron_model_type(["language_model.encoder.final_norm.weight", "lm_head.bias"]) == (
        "bert"
    )


def test_another_model_type_is_refused(tmp_path):
    cfg, state = bert(True)
    save_megatron_checkpoint(cfg, state, tmp_path / "bert")
    with pytest.raises(ConversionError, match=r"holds a 'bert' model.*expected model.type='gpt'"):
        load_megatron_checkpoint(tmp_path / "bert", model_type="gpt")
    gpt = gpt2_like(num_layers=2)
    save_megatron_checkpoint(gpt, ours(gpt).state_dict(), tmp_path / "gpt", pipeline_parallel=2)
    with pytest.raises(ConversionError, match=r"holds a 'gpt' model.*expected model.type='bert'"):
        load_megatron_checkpoint(tmp_path / "gpt", model_type="bert")
    assert load_megatron_checkpoint(tmp_path / "gpt", model_type="gpt").config.type == "gpt"


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"type": "esm"}, "model.type='esm' has no Megatron-LM counterpart"),
        ({"transformer_block_type": "post_ln"}, "transformer_block_type='post_ln'"),
        ({"activation": "gelu_tanh"}, "BertLMHead always uses the exact GELU"),
    ],
)
def test_encoders_megatron_cannot_express_are_refused(tmp_path, changes, match):
    if changes.get("type") == "esm":
        cfg = encoder_like("esm")
    else:
        cfg = dataclasses.replace(encoder_like(), **changes)
    state = build_model(cfg).state_dict()
    with pytest.raises(ConversionError, match=match):
        save_megatron_checkpoint(cfg, state, tmp_path / "x")
    assert not (tmp_path / "x").exists() or not any((tmp_path / "x").iterdir())


def test_binary_head_args_must_match_the_tensors(tmp_path):
    cfg, state = bert(True)
    save_megatron_checkpoint(cfg, state, tmp_path)
    path = rank_file(tmp_path, 0, None)
    payload = safe_torch_load(path)
    payload["args"].bert_binary_head = False
    torch.save(payload, path)
    with pytest.raises(ConversionError, match="bert_binary_head=False, but the last pipeline"):
        load_megatron_checkpoint(tmp_path)


def test_fused_bias_gelu_imports_as_tanh_with_a_warning(tmp_path):
    cfg, state = bert(False)
    save_megatron_checkpoint(cfg, state, tmp_path)
    path = rank_file(tmp_path, 0, None)
    payload = safe_torch_load(path)
    payload["args"].bias_gelu_fusion = True  # Megatron-LM's default
    torch.save(payload, path)
    with pytest.warns(UserWarning, match="BertLMHead applies the exact GELU"):
        back = load_megatron_checkpoint(tmp_path)
    assert back.config.activation == "gelu_tanh" and back.config.type == "bert"


def test_cli_epochal_bert_to_megatron_and_back(tmp_path, capsys):
    cfg, state = bert(True)
    save_epochal_checkpoint(cfg, state, tmp_path / "run")
    argv = ["convert", str(tmp_path / "run"), str(tmp_path / "mg"), "--to", "megatron"]
    assert main([*argv, "--tensor-parallel", "2", "--pipeline-parallel", "2"]) == 0
    assert "TP2 x PP2" in capsys.readouterr().out
    assert (tmp_path / "mg" / TRACKER_FILE).is_file()
    assert main(["convert", str(tmp_path / "mg"), str(tmp_path / "back"), "--to", "epochal"]) == 0
    back = load_epochal_checkpoint(tmp_path / "back")
    assert back.config == cfg
    assert_same_state(back.state, state)
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    a, b = build_model(cfg).eval(), build_model(back.config).eval()
    a.load_state_dict(state)
    b.load_state_dict(back.state)
    with torch.no_grad():
        for x, y in zip(a(tokens), b(tokens)):
            assert torch.equal(x, y)
    esm = encoder_like("esm")
    save_epochal_checkpoint(esm, build_model(esm).state_dict(), tmp_path / "esm")
    assert main(["convert", str(tmp_path / "esm"), str(tmp_path / "esm_mg"), "--to", "megatron"])
    assert "no Megatron-LM counterpart" in capsys.readouterr().err
