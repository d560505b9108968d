"""The presets derive from one another (a base plus overrides), and the merge that builds them."""

from __future__ import annotations

import pytest

from epochal.train.config.merge import DROP, Replace, deep_merge
from epochal.train.config.presets import PRESETS, preset_dict


def _without(table: dict, *keys: str) -> dict:
    return {k: v for k, v in table.items() if k not in keys}


def test_deep_merge_merges_tables_replaces_values_and_shares_nothing():
    base = {"a": {"x": 1, "y": [1]}, "b": {"z": 2}, "c": 3, "d": {"k": 1}}
    update = {"a": {"y": [2], "w": 4}, "b": Replace({"q": 5}), "c": DROP, "d": {"k": DROP}}
    merged = deep_merge(base, update)
    assert merged == {"a": {"x": 1, "y": [2], "w": 4}, "b": {"q": 5}, "d": {}}
    assert list(merged["a"]) == ["x", "y", "w"]  # the base's order, new keys after
    assert type(merged["b"]) is dict
    merged["a"]["x"] = 9
    assert base == {"a": {"x": 1, "y": [1]}, "b": {"z": 2}, "c": 3, "d": {"k": 1}}
    assert deep_merge(base, {}) == base and deep_merge(base, {})["a"] is not base["a"]


def test_moe_and_sft_tiny_are_tiny_with_their_own_options():
    tiny, moe, sft = PRESETS["tiny"], PRESETS["moe-tiny"], PRESETS["sft-tiny"]
    moe_options = {k: v for k, v in moe["model"].items() if k.startswith(("moe_", "num_experts"))}
    assert moe["model"] == {**tiny["model"], **moe_options} and moe_options["num_experts"] == 4
    assert moe["data"] == tiny["data"]  # one corpus and tokenizer cache for both
    assert sft["model"] == tiny["model"]
    assert sft["data"] == {"seq_length": 128}  # the chat rows replace tiny's corpus
    for name in ("optimizer", "scheduler", "logging"):
        assert moe[name] == sft[name] == tiny[name], name
    assert _without(moe["training"], "train_iters", "eval_interval", "eval_iters") == _without(
        tiny["training"], "train_iters", "eval_interval", "eval_iters"
    )


def test_t5_tiny_is_bert_tinys_encoder_and_recipe_as_an_encoder_decoder():
    bert, t5 = PRESETS["bert-tiny"], PRESETS["t5-tiny"]
    assert t5["model"]["type"] == "t5" and t5["model"]["output_bias"] is True
    shared = _without(bert["model"], "type", "num_layers", "num_tokentypes", "bert_binary_head")
    assert _without(t5["model"], "type", "num_layers", "output_bias") == shared
    assert {k: t5["data"][k] for k in bert["data"]} == bert["data"]  # corpus and vocabulary
    for name in ("training", "optimizer", "scheduler", "checkpoint", "logging"):
        assert t5[name] == bert[name], name


def test_esm2_8m_and_gpu_1b_scale_their_bases_architecture():
    sizes = ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size")
    esm, esm8m = PRESETS["esm-tiny"], PRESETS["esm2-8m"]
    assert _without(esm8m["model"], *sizes) == _without(esm["model"], *sizes)
    assert esm8m["optimizer"] == {**esm["optimizer"], "lr": 4e-4, "min_lr": 4e-5}
    assert "mock" not in esm8m["data"] and "seed" not in esm8m["training"]
    tiny, big = PRESETS["tiny"], PRESETS["gpu-1b"]
    scaled = (*sizes, "num_query_groups", "vocab_size", "norm_epsilon")
    untied = "untie_embeddings_and_output_weights"
    assert _without(big["model"], *scaled, untied) == _without(tiny["model"], *scaled)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_dict_is_a_copy_that_shares_no_table(name):
    first = preset_dict(name)
    first["model"]["hidden_size"] = -1
    first["training"]["train_iters"] = -1
    assert preset_dict(name) == PRESETS[name] and PRESETS[name]["model"]["hidden_size"] > 0
    if name != "tiny":  # derived presets hold tables of their own, not their base's
        assert all(PRESETS[name][s] is not PRESETS["tiny"].get(s) for s in PRESETS[name])
