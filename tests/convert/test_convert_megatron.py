"""Megatron-LM legacy checkpoints: TP x PP round trips, hand-built QKV/SwiGLU layouts, legacy names, errors."""

from __future__ import annotations

import argparse
import itertools
import os
import shutil

import pytest
import torch

from epochal.convert.megatron.args import (
    config_from_megatron_args,
    megatron_args_from_config,
    megatron_padded_vocab_size,
)
from epochal.convert.megatron.layout import pack_qkv, qkv_rows_to_v2, unpack_qkv
from epochal.convert.megatron.legacy import (
    TRACKER_FILE,
    load_megatron_checkpoint,
    save_megatron_checkpoint,
)
from epochal.formats.common import ConversionError
from epochal.formats.safe_load import UnsafeCheckpointError, safe_torch_load
from epochal.model import GPTModel
from tests.convert.hf_models import gpt2_like, llama_like, ours
from tests.convert.megatron_names import legacy_language_model

CONFIGS = {
    "gpt2_tied": lambda: gpt2_like(num_layers=4, activation="gelu"),
    "llama_gqa_untied": lambda: llama_like(num_layers=4),
    "swiglu_bias_mqa": lambda: llama_like(
        num_layers=4, num_query_groups=None, add_bias_linear=True, normalization="LayerNorm"
    ),
}


def assert_same_state(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize(
    ("name", "spec"), itertools.product(CONFIGS, ["transformer_engine", "local"])
)
def test_round_trip_tp2_pp2_identical_weights(tmp_path, name, spec):
    model = ours(CONFIGS[name](), seed=11)
    state = model.state_dict()
    folder = save_megatron_checkpoint(
        model.config,
        state,
        tmp_path,
        tensor_parallel=2,
        pipeline_parallel=2,
        iteration=20,
        spec=spec,
    )
    assert folder.name == "iter_0000020"
    assert (tmp_path / TRACKER_FILE).read_text().strip() == "20"
    assert sorted(p.name for p in folder.iterdir()) == [
        "mp_rank_00_000",
        "mp_rank_00_001",
        "mp_rank_01_000",
        "mp_rank_01_001",
    ]
    back = load_megatron_checkpoint(tmp_path)
    assert back.config == model.config
    assert (back.tensor_parallel, back.pipeline_parallel, back.iteration) == (2, 2, 20)
    assert_same_state(back.state, state)
    # a re-export at another layout reads back identically too
    save_megatron_checkpoint(
        back.config, back.state, tmp_path / "tp4", tensor_parallel=1, pipeline_parallel=4
    )
    assert_same_state(load_megatron_checkpoint(tmp_path / "tp4").state, state)


def test_rank_files_hold_megatron_names_and_shards(tmp_path):
    cfg = llama_like(num_layers=4)
    save_megatron_checkpoint(
        cfg, ours(cfg).state_dict(), tmp_path, tensor_parallel=2, pipeline_parallel=2
    )
    first = safe_torch_load(tmp_path / "iter_0000000" / "mp_rank_01_000" / "model_optim_rng.pt")
    last = safe_torch_load(tmp_path / "iter_0000000" / "mp_rank_01_001" / "model_optim_rng.pt")
    assert first["checkpoint_version"] == 3.0
    args = first["args"]
    assert isinstance(args, argparse.Namespace)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (2, 2)
    assert args.padded_vocab_size == megatron_padded_vocab_size(100, 128, 2) == 256
    m = first["model"]
    assert m["embedding.word_embeddings.weight"].shape == (128, 32)  # 256 rows / TP2
    assert m["decoder.layers.1.self_attention.linear_qkv.layer_norm_weight"].shape == (32,)
    # 4 heads, 2 groups, head_dim 8: a TP rank holds 1 group = (2 q + k + v) x 8 rows
    assert m["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (32, 32)
    assert m["decoder.layers.0.self_attention.linear_proj.weight"].shape == (32, 16)
    assert m["decoder.layers.0.mlp.linear_fc1.weight"].shape == (48, 32)  # [gate; up] halves of 48
    assert "decoder.layers.2.input_layernorm.weight" not in m  # stage 0 has 2 local layers
    assert m["decoder.layers.0.self_attention.linear_qkv._extra_state"] is None
    assert "output_layer.weight" not in m and "decoder.final_layernorm.weight" not in m
    assert set(last["model"]) >= {"output_layer.weight", "decoder.final_layernorm.weight"}
    assert "embedding.word_embeddings.weight" not in last["model"]


def test_qkv_order_hand_built(tmp_path):
    """4 query heads, 2 groups, head_dim 2; row r of wq/wk/wv holds 100+r / 200+r / 300+r."""
    cfg = llama_like(
        hidden_size=8, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=8, num_layers=1
    )
    model = GPTModel(cfg)
    state = model.state_dict()
    for proj, base in (("wq", 100), ("wk", 200), ("wv", 300)):
        w = state[f"layers.0.attention.{proj}.weight"]
        w.copy_((base + torch.arange(w.shape[0], dtype=torch.float32))[:, None].expand_as(w))
    save_megatron_checkpoint(cfg, state, tmp_path, tensor_parallel=2, spec="local")
    rows = []
    for t in range(2):
        shard = safe_torch_load(
            tmp_path / "iter_0000000" / f"mp_rank_{t:02d}" / "model_optim_rng.pt"
        )
        rows.append(
            shard["model"]["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0].tolist()
        )
    # group 0 on TP rank 0: q heads 0,1 then k0, v0; group 1 on rank 1.
    assert rows[0] == [100, 101, 102, 103, 200, 201, 300, 301]
    assert rows[1] == [104, 105, 106, 107, 202, 203, 302, 303]
    # multi-head attention: the per-head [q, k, v] order of legacy checkpoints
    q = torch.arange(4.0)[:, None] + 10
    k = torch.arange(4.0)[:, None] + 20
    v = torch.arange(4.0)[:, None] + 30
    fused = pack_qkv(q, k, v, num_groups=2, head_dim=2)
    assert fused[:, 0].tolist() == [10, 11, 20, 21, 30, 31, 12, 13, 22, 23, 32, 33]
    for a, b in zip(unpack_qkv(fused, 2, 2, 2), (q, k, v)):
        assert torch.equal(a, b)


def test_swiglu_fc1_is_gate_up_per_rank(tmp_path):
    cfg = llama_like(
        hidden_size=8, num_attention_heads=2, num_query_groups=None, ffn_hidden_size=4, num_layers=1
    )
    state = GPTModel(cfg).state_dict()
    state["layers.0.mlp.w1.weight"].copy_(torch.arange(4.0)[:, None].expand(4, 8) + 10)
    state["layers.0.mlp.w3.weight"].copy_(torch.arange(4.0)[:, None].expand(4, 8) + 20)
    save_megatron_checkpoint(cfg, state, tmp_path, tensor_parallel=2, spec="local")
    got = [
        safe_torch_load(tmp_path / "iter_0000000" / f"mp_rank_{t:02d}" / "model_optim_rng.pt")[
            "model"
        ]["decoder.layers.0.mlp.linear_fc1.weight"][:, 0].tolist()
        for t in range(2)
    ]
    assert got == [[10, 11, 20, 21], [12, 13, 22, 23]]


def _legacy_names(state: dict) -> dict:
    """Megatron-Core local names (one rank) -> nested legacy ``language_model`` dicts."""
    lm, rest = legacy_language_model(state, "decoder")
    if "output_layer.weight" in rest:
        lm["output_layer"] = {"weight": rest["output_layer.weight"]}
    return {"language_model": lm}


@pytest.mark.parametrize("version", [0, 1.0, 2.0])
def test_legacy_names_and_old_qkv_orders(tmp_path, version):
    cfg = gpt2_like(num_layers=2, activation="gelu")
    state = ours(cfg, seed=3).state_dict()
    save_megatron_checkpoint(cfg, state, tmp_path / "mcore", spec="local", iteration=5)
    path = tmp_path / "mcore" / "iter_0000005" / "mp_rank_00" / "model_optim_rng.pt"
    payload = safe_torch_load(path)
    model = payload["model"]
    heads, hd = cfg.num_attention_heads, cfg.head_dim
    for name in [n for n in model if "linear_qkv" in n and not n.endswith("_extra_state")]:
        t = model[name]  # v2 order [heads, 3, d] -> the old order
        rest = t.shape[1:]
        if version == 0:
            model[name] = t.reshape(heads, 3, hd, *rest).transpose(0, 1).reshape(-1, *rest)
        elif version == 1.0:
            model[name] = t.reshape(heads, 3, hd, *rest).transpose(1, 2).reshape(-1, *rest)
        assert torch.equal(qkv_rows_to_v2(model[name], version, heads, hd), t)
    payload["model"] = _legacy_names(model)
    payload["checkpoint_version"] = version
    for attr in ("position_embedding_type", "norm_epsilon", "vocab_size", "group_query_attention"):
        delattr(payload["args"], attr)  # as in old checkpoints
    payload["args"].bias_gelu_fusion = False
    legacy = tmp_path / "legacy" / "release" / "mp_rank_00"
    legacy.mkdir(parents=True)
    torch.save(payload, legacy / "model_optim_rng.pt")
    (tmp_path / "legacy" / TRACKER_FILE).write_text("release")
    back = load_megatron_checkpoint(tmp_path / "legacy", vocab_size=100)
    assert back.iteration is None and back.config == cfg
    assert_same_state(back.state, state)


def test_gelu_fusion_means_tanh_gelu(tmp_path):
    cfg = gpt2_like(activation="gelu")
    save_megatron_checkpoint(cfg, ours(cfg).state_dict(), tmp_path, spec="local")
    path = tmp_path / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt"
    payload = safe_torch_load(path)
    payload["args"].bias_gelu_fusion = True  # Megatron-LM's default: fused bias + tanh-GELU
    torch.save(payload, path)
    assert load_megatron_checkpoint(tmp_path).config.activation == "gelu_tanh"


def test_errors_name_the_problem(tmp_path):
    cfg = gpt2_like(num_layers=4)
    state = ours(cfg).state_dict()
    with pytest.raises(ConversionError, match="pipeline_parallel=3 must divide num_layers=4"):
        save_megatron_checkpoint(cfg, state, tmp_path / "a", pipeline_parallel=3)
    with pytest.raises(ConversionError, match="tensor_parallel=3 must divide num_attention_heads"):
        save_megatron_checkpoint(cfg, state, tmp_path / "a", tensor_parallel=3)
    with pytest.raises(ConversionError, match="ALiBi"):
        save_megatron_checkpoint(gpt2_like(position_embedding_type="alibi"), state, tmp_path / "a")
    partial = {k: v for k, v in state.items() if k != "layers.1.mlp.fc2.weight"}
    with pytest.raises(ConversionError, match=r"missing \['layers\.1\.mlp\.fc2\.weight'\]"):
        save_megatron_checkpoint(cfg, partial, tmp_path / "a")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())

    save_megatron_checkpoint(cfg, state, tmp_path / "b", tensor_parallel=2, pipeline_parallel=2)
    with pytest.raises(FileExistsError):
        save_megatron_checkpoint(cfg, state, tmp_path / "b", tensor_parallel=2, pipeline_parallel=2)
    iteration = tmp_path / "b" / "iter_0000000"
    shutil.rmtree(iteration / "mp_rank_01_001")
    with pytest.raises(ConversionError, match="tensor rank 1, pipeline rank 1 is missing"):
        load_megatron_checkpoint(tmp_path / "b")
    (tmp_path / "b" / TRACKER_FILE).write_text("garbage")
    with pytest.raises(ConversionError, match="iteration number or 'release'"):
        load_megatron_checkpoint(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="not a Megatron checkpoint"):
        load_megatron_checkpoint(tmp_path)

    save_megatron_checkpoint(cfg, state, tmp_path / "c", spec="local")
    path = tmp_path / "c" / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt"
    payload = safe_torch_load(path)
    payload["args"].hook = os.system  # an object we must never unpickle
    torch.save(payload, path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to unpickle.*system"):
        load_megatron_checkpoint(tmp_path / "c")
    payload["args"].hook = None
    payload["model"]["decoder.layers.9.mlp.linear_fc1.weight"] = torch.zeros(1)
    torch.save(payload, path)
    with pytest.raises(ConversionError, match="found 10 layers|layer indices"):
        load_megatron_checkpoint(tmp_path / "c")
    del payload["model"]["decoder.layers.9.mlp.linear_fc1.weight"]
    payload["model0"] = payload.pop("model")
    torch.save(payload, path)
    with pytest.raises(ConversionError, match="virtual-pipeline"):
        load_megatron_checkpoint(tmp_path / "c")


def test_replicated_shards_must_agree(tmp_path):
    cfg = gpt2_like()
    save_megatron_checkpoint(cfg, ours(cfg).state_dict(), tmp_path, tensor_parallel=2, spec="local")
    path = tmp_path / "iter_0000000" / "mp_rank_01" / "model_optim_rng.pt"
    payload = safe_torch_load(path)
    payload["model"]["decoder.layers.0.input_layernorm.weight"] += 1
    torch.save(payload, path)
    with pytest.raises(ConversionError, match="input_layernorm.weight: replicated tensor differs"):
        load_megatron_checkpoint(tmp_path)


def test_apply_layernorm_1p_weights_import_plus_one(tmp_path):
    """``--apply-layernorm-1p`` checkpoints store norm weights minus one (zero-centered gamma)."""
    cfg = gpt2_like()
    state = ours(cfg, seed=6).state_dict()
    save_megatron_checkpoint(cfg, state, tmp_path, tensor_parallel=2, spec="local")
    for t in range(2):
        path = tmp_path / "iter_0000000" / f"mp_rank_{t:02d}" / "model_optim_rng.pt"
        payload = safe_torch_load(path)
        payload["args"].apply_layernorm_1p = True
        for name, tensor in payload["model"].items():
            if "layernorm.weight" in name:
                tensor -= 1
        torch.save(payload, path)
    assert_same_state(load_megatron_checkpoint(tmp_path).state, state)


def _args(cfg, **changes) -> argparse.Namespace:
    args = megatron_args_from_config(
        cfg,
        tensor_parallel=1,
        pipeline_parallel=1,
        iteration=0,
        dtype=torch.float32,
        transformer_impl="local",
    )
    for name, value in changes.items():
        setattr(args, name, value)
    return args


def test_rope_scaling_args_round_trip(tmp_path):
    llama31 = llama_like(rope_scaling_type="llama3", rope_scaling_factor=8.0, rotary_base=5e5)
    args = _args(llama31)
    assert args.use_rope_scaling is True and args.rope_scaling_factor == 8.0
    assert args.rotary_seq_len_interpolation_factor is None
    assert config_from_megatron_args(args)[0] == llama31
    linear = llama_like(rope_scaling_type="linear", rope_scaling_factor=4.0)
    args = _args(linear)
    assert args.use_rope_scaling is False and args.rotary_seq_len_interpolation_factor == 4
    assert config_from_megatron_args(args)[0] == linear
    plain = _args(llama_like())
    assert plain.use_rope_scaling is False and plain.rotary_seq_len_interpolation_factor is None
    assert config_from_megatron_args(plain)[0] == llama_like()
    # Megatron-LM's own spellings: --rope-scaling-factor defaults to 8, an interpolation factor
    # of 1 is no interpolation
    del plain.rope_scaling_factor
    plain.use_rope_scaling = True
    got = config_from_megatron_args(plain)[0]
    assert (got.rope_scaling_type, got.rope_scaling_factor) == ("llama3", 8.0)
    assert (got.rope_low_freq_factor, got.rope_high_freq_factor) == (1.0, 4.0)
    assert got.rope_original_max_position_embeddings == 8192
    one = _args(llama_like(), rotary_seq_len_interpolation_factor=1)
    assert config_from_megatron_args(one)[0].rope_scaling_type is None
    # and through a whole checkpoint, sharded
    model = ours(llama31, seed=3)
    save_megatron_checkpoint(llama31, model.state_dict(), tmp_path, tensor_parallel=2)
    back = load_megatron_checkpoint(tmp_path)
    assert back.config == llama31
    assert_same_state(back.state, model.state_dict())


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (
            dict(rope_scaling_type="llama3", rope_scaling_factor=8.0, rope_low_freq_factor=2.0),
            "rope_low_freq_factor=2.0",
        ),
        (
            dict(rope_scaling_type="llama3", rope_scaling_factor=8.0, rope_high_freq_factor=8.0),
            "rope_high_freq_factor=8.0",
        ),
        (
            dict(
                rope_scaling_type="llama3",
                rope_scaling_factor=8.0,
                rope_original_max_position_embeddings=4096,
            ),
            "rope_original_max_position_embeddings=4096",
        ),
        (dict(rope_scaling_type="linear", rope_scaling_factor=2.5), "rope_scaling_factor=2.5"),
        (dict(rope_scaling_type="linear", rope_scaling_factor=0.5), "rope_scaling_factor=0.5"),
    ],
)
def test_rope_scaling_megatron_cannot_express_is_refused(tmp_path, changes, match):
    cfg = llama_like(**changes)
    with pytest.raises(ConversionError, match=f"cannot export to Megatron.*{match}"):
        save_megatron_checkpoint(cfg, ours(cfg).state_dict(), tmp_path)
    assert not any(tmp_path.iterdir())


def test_rope_scaling_import_refusals():
    args = _args(llama_like(), use_rope_scaling=True, rotary_seq_len_interpolation_factor=2)
    with pytest.raises(ConversionError, match="use_rope_scaling=True together with"):
        config_from_megatron_args(args)
    args = _args(llama_like(), apply_rope_fusion_scaling=True)
    with pytest.raises(ConversionError, match="apply_rope_fusion_scaling=True"):
        config_from_megatron_args(args)
    # learned positions: Megatron ignores the RoPE flags, so do we
    gpt2 = _args(gpt2_like(), use_rope_scaling=True, rotary_seq_len_interpolation_factor=4)
    assert config_from_megatron_args(gpt2)[0] == gpt2_like()
