"""Generation with the model tensor-parallel (TP2, gloo) equals single-process generation.

The same two processes also save the sharded model with the trainer's DCP
checkpointer; ``epochal.convert`` then reads it back in one process (resharding)
and must get the unsharded weights.
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo

pytestmark = pytest.mark.distributed

CASES = {
    "gqa_swiglu_rope": dict(num_query_groups=2),
    "mqa_replicated_kv": dict(num_query_groups=1),
    "gpt2_alibi_tied": dict(
        num_query_groups=None,
        position_embedding_type="alibi",
        activation="gelu",
        normalization="LayerNorm",
        add_bias_linear=True,
        untie_embeddings_and_output_weights=False,
        ffn_hidden_size=None,
    ),
}
OPTIONS = {
    "greedy": dict(max_new_tokens=8),
    "beam": dict(max_new_tokens=6, num_beams=3, length_penalty=0.7),
    "sample": dict(max_new_tokens=8, do_sample=True, top_k=10, top_p=0.9, temperature=0.8, seed=5),
}
PROMPTS = [[5, 17, 3, 9], [22, 8], [40, 41, 42, 43, 44, 45]]


def _run(rank: int, world: int, ckpt_dir: str) -> dict[str, list[list[int]]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model.generation.decoding import generate
    from epochal.parallel.tensor_parallel import apply_tensor_parallel
    from epochal.train.state.checkpoint import Checkpointer
    from epochal.train.state.model_state import ModelState
    from tests.convert.hf_models import llama_like, ours

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    results = {}
    for case, kw in CASES.items():
        single = ours(llama_like(**kw), seed=8)
        parallel = ours(llama_like(**kw), seed=8)
        apply_tensor_parallel(parallel, mesh["tp"], sequence_parallel=False, loss_parallel=False)
        assert any(hasattr(p, "placements") for p in parallel.parameters())  # really sharded
        for name, opts in OPTIONS.items():
            want = generate(single, PROMPTS, **opts).tokens
            got = generate(parallel, PROMPTS, **opts).tokens
            results[f"{case}/{name}"] = [want, got]
        if case == "gqa_swiglu_rope":
            Checkpointer(ckpt_dir, rank=rank, barrier=dist.barrier).save(
                3,
                {"model": ModelState([parallel])},
                trainer_state={"format": 1, "step": 3, "model_config": single.config.to_dict()},
                rng_state={},
            )
    return results


def test_tp2_generation_equals_single_process_and_sharded_checkpoint_loads(tmp_path):
    import torch

    from epochal.train.state.epochal_ckpt import load_epochal_checkpoint
    from tests.convert.hf_models import llama_like, ours

    ranks = run_gloo(_run, 2, str(tmp_path))
    for key, (want, got) in ranks[0].items():
        assert got == want, key
        assert ranks[1][key] == [want, got], key  # every rank produces the same tokens
    ck = load_epochal_checkpoint(tmp_path)
    reference = ours(llama_like(**CASES["gqa_swiglu_rope"]), seed=8)
    assert ck.step == 3 and ck.config == reference.config
    for name, tensor in reference.state_dict().items():
        assert torch.equal(ck.state[name], tensor), name


#: canonical units need key/value heads that split over the ranks (no replicated case)
CANONICAL_CASES = ("gqa_swiglu_rope", "gpt2_alibi_tied")
#: T5 models (encoder-decoder generation: a cross-attention cache), dropout set, evaluated
T5_CASES = {
    "t5_megatron": dict(position_embedding_type="learned_absolute"),
    "t5_hf_relative": dict(
        position_embedding_type="relative",
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        normalization="RMSNorm",
        activation="gated_gelu",
        add_bias_linear=False,
        softmax_scale=1.0,
        untie_embeddings_and_output_weights=True,
    ),
}


def _t5(**overrides):
    from epochal.model.build import build_model
    from epochal.model.config import ModelConfig

    config = ModelConfig(
        type="t5", vocab_size=128, hidden_size=32, num_layers=2, num_attention_heads=4,
        num_query_groups=4, ffn_hidden_size=64, max_position_embeddings=64,
        hidden_dropout=0.1, attention_dropout=0.1, **overrides,
    )  # fmt: skip
    return build_model(config, seed=8).eval()


def _run_canonical(rank: int, world: int) -> dict[str, list]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model.generation.decoding import generate
    from epochal.parallel.canonical_plan import install_canonical
    from tests.convert.hf_models import llama_like, ours

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    results: dict[str, list] = {}
    builders = {
        case: lambda c=case: ours(llama_like(**CASES[c]), seed=8) for case in CANONICAL_CASES
    }
    builders.update({case: lambda c=case: _t5(**T5_CASES[c]) for case in T5_CASES})
    for case, build in builders.items():
        single, parallel, plain = build(), build(), build()
        # installed on evaluated models (as `epochal generate` does): they stay in evaluation
        install_canonical(single, 8, training=False)
        install_canonical(parallel, 8, mesh["tp"], gather_logits=True, training=False)
        assert any(hasattr(p, "placements") for p in parallel.parameters())  # really sharded
        prompts = torch.tensor([PROMPTS[0]])
        with torch.no_grad():  # the units compute the plain model's logits, up to rounding
            if case in T5_CASES:
                args = (prompts, torch.tensor([[0, 3, 7]]))
            else:
                args = (prompts,)
            near = torch.allclose(single(*args), plain(*args), atol=1e-4)
        results[f"{case}/plain"] = near
        for model in (single, parallel):  # every forward's logits: the prefill, then each step
            model.seen = []
            model.output.register_forward_hook(  # the head: GPT's forward, T5's decode
                lambda m, a, out, model=model: model.seen.append(out.detach().clone())
            )
        for name, opts in OPTIONS.items():
            single.seen.clear()
            parallel.seen.clear()
            want = generate(single, PROMPTS, **opts).tokens
            got = generate(parallel, PROMPTS, **opts).tokens
            same = len(single.seen) == len(parallel.seen) and all(
                torch.equal(a, b) for a, b in zip(single.seen, parallel.seen, strict=True)
            )
            results[f"{case}/{name}"] = [want, got, same, len(single.seen)]
    return results


def test_tp2_generation_in_canonical_units_gives_one_process_logits_bit_for_bit():
    ranks = run_gloo(_run_canonical, 2)
    for key in [k for k in ranks[0] if k.endswith("/plain")]:
        assert ranks[0].pop(key) and ranks[1].pop(key), key
    assert {k.split("/")[0] for k in ranks[0]} == {*CANONICAL_CASES, *T5_CASES}
    for key, (want, got, same, forwards) in ranks[0].items():
        assert got == want, key
        assert same and forwards > 1, key  # every step's logits, the same bits
        assert ranks[1][key][:3] == [want, got, True], key
