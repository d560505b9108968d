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


def _run_canonical(rank: int, world: int) -> dict[str, list]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from epochal.model.generation.decoding import generate
    from epochal.parallel.canonical_plan import install_canonical
    from tests.convert.hf_models import llama_like, ours

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    results: dict[str, list] = {}
    for case in CANONICAL_CASES:
        single = ours(llama_like(**CASES[case]), seed=8)
        parallel = ours(llama_like(**CASES[case]), seed=8)
        install_canonical(single, 8)
        install_canonical(parallel, 8, mesh["tp"], gather_logits=True)
        assert any(hasattr(p, "placements") for p in parallel.parameters())  # really sharded
        for model in (single, parallel):  # every forward's logits: the prefill, then each step
            model.seen = []
            model.register_forward_hook(lambda m, a, out: m.seen.append(out.detach().clone()))
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
    for key, (want, got, same, forwards) in ranks[0].items():
        assert got == want, key
        assert same and forwards > 1, key  # every step's logits, the same bits
        assert ranks[1][key][:3] == [want, got, True], key
