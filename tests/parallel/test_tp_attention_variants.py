"""Tensor parallelism (TP2, gloo) of QK-norm, q/k/v biases and a sliding window (Qwen2/3, Mistral).

The sharded model's logits and every gradient (the QK-norm weights, summed over the
group, included) equal the single-process model's, with and without sequence
parallelism, for key/value heads sharded (2 groups) and replicated (1 group).
(Two of the four combinations, to keep the test cheap.)
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo

pytestmark = pytest.mark.distributed

#: case -> (model options, sequence parallel)
CASES = {
    "qwen3_kv_sharded": (dict(num_query_groups=2, qk_layernorm=True, kv_channels=12), False),
    "qwen2_window_kv_replicated_sp": (
        dict(num_query_groups=1, add_qkv_bias=True, qk_layernorm=True, sliding_window=5),
        True,
    ),
}


def _run(rank: int, world: int) -> dict[str, float]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from epochal.parallel.tensor_parallel import apply_tensor_parallel
    from tests.convert.hf_models import llama_like, ours

    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    tokens = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(3))
    worst: dict[str, float] = {}
    for case, (kw, sp) in CASES.items():
        single = ours(llama_like(**kw), seed=6)
        parallel = ours(llama_like(**kw), seed=6)
        apply_tensor_parallel(parallel, mesh["tp"], sequence_parallel=sp, loss_parallel=False)
        norm = parallel.layers["0"].attention.q_layernorm.weight
        assert isinstance(norm, DTensor)
        want, got = single(tokens), parallel(tokens)
        (want.square().mean()).backward()
        (got.square().mean()).backward()
        errors = [(got - want).abs().max().item()]
        for (name, p), (_, q) in zip(
            single.named_parameters(), parallel.named_parameters(), strict=True
        ):
            grad = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
            errors.append((grad - p.grad).abs().max().item())
            if "layernorm" in name:
                assert p.grad.abs().max() > 1e-6, name  # the comparison is not empty
        worst[case] = max(errors)
    return worst


def test_tp2_qk_norm_biases_and_window_equal_single_process():
    for rank_result in run_gloo(_run, 2):
        for key, err in rank_result.items():
            assert err < 1e-5, key
