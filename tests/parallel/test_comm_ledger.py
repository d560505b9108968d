"""The communication ledger counts the bytes a data-parallel step must send, taken from the model."""

from __future__ import annotations

import pytest
import torch

from epochal.model import build_model
from tests.dist_utils import run_gloo
from tests.parallel import comm_worker as W

pytestmark = pytest.mark.distributed

MICRO_BATCHES = 3  # per rank and step


@pytest.fixture(scope="module")
def ledgers():
    return run_gloo(W.rank_main, 2, MICRO_BATCHES, timeout=300)


@pytest.fixture(scope="module")
def grad_bytes():
    """fp32 gradient bytes of the whole model, from the model's own parameters."""
    model = build_model(W.model_config())
    return sum(p.numel() for p in model.parameters()) * 4


def _calls(step, kind, group):
    return [size for k, g, size in step if (k, g) == (kind, group)]


def test_data_parallel_reduces_every_gradient_once_per_step(ledgers, grad_bytes):
    for rank in ledgers:
        (step,) = rank["dp"]
        reduces = _calls(step, "all_reduce", "dp")
        assert [b for b in reduces if b > 64] == [grad_bytes]  # one fused gradient all-reduce
        assert all(b <= 8 for b in reduces if b <= 64)  # and scalars (the step loss)
        assert {k for k, g, _ in step} == {"all_reduce"}


def test_layout_invariance_exchanges_every_micro_batch(ledgers, grad_bytes):
    for rank in ledgers:
        (step,) = rank["dp_invariant"]
        exchanges = _calls(step, "all_to_all", "dp")
        assert len(exchanges) == MICRO_BATCHES  # one exchange per micro-batch (one bucket each)
        assert sum(exchanges) == MICRO_BATCHES * grad_bytes
        gathers = [b for b in _calls(step, "all_gather", "dp") if b > 64]
        assert gathers == [grad_bytes]  # the reduced shards, gathered once (dp_sharding none)


def test_tensor_parallel_collectives_of_dtensor_are_counted(ledgers):
    activation = W.MBS * W.SEQ * W.model_config().hidden_size * 4  # one micro-batch, fp32
    layers = W.model_config().num_layers
    for rank in ledgers:
        (step,) = rank["tp_sp"]
        gathers = _calls(step, "all_gather", "tp")
        scatters = _calls(step, "reduce_scatter", "tp")
        # sequence parallelism (Megatron): per layer and micro-batch, an all-gather before and a
        # reduce-scatter after attention and the MLP, forward and backward: 4 each at least
        assert sum(b == activation for b in gathers) >= 4 * layers * MICRO_BATCHES
        assert sum(b == activation for b in scatters) >= 4 * layers * MICRO_BATCHES
        assert torch.tensor(gathers).sum() == torch.tensor(scatters).sum()


def _keys_and_values_of_one_micro_batch() -> tuple[int, int]:
    """(bytes, tensors) of the keys and values one micro-batch's forward computes, whole sequence.

    Read from the model itself: every self-attention's seam records the ``k`` and
    ``v`` it receives (one process, the whole ``[MBS, SEQ]`` batch).
    """
    from epochal.model.layers.attention import Attention

    model = build_model(W.model_config())
    seen: list[torch.Tensor] = []

    def record(q, k, v, **kwargs):
        seen.extend([k, v])
        return torch.zeros_like(q)

    for module in model.modules():
        if isinstance(module, Attention):
            module.core_attention = record
    tokens = torch.zeros(W.MBS, W.SEQ, dtype=torch.long)
    with torch.no_grad():
        model(tokens)
    return sum(t.numel() * t.element_size() for t in seen), len(seen)


def test_context_parallel_gathers_the_keys_and_values_the_model_computes(ledgers, grad_bytes):
    kv_bytes, kv_tensors = _keys_and_values_of_one_micro_batch()
    kv_sizes = kv_bytes // kv_tensors
    losses = W.MBS * W.SEQ * 4  # the per-token losses (fp32) gathered back to the whole sequence
    for rank in ledgers:
        (step,) = rank["cp"]
        gathers = _calls(step, "all_gather", "cp")
        kv_gathers = [b for b in gathers if b != losses]
        # forward: every layer gathers the whole sequence's K and V (the gathered output)
        assert len(kv_gathers) == kv_tensors * MICRO_BATCHES
        assert sum(kv_gathers) == kv_bytes * MICRO_BATCHES
        assert set(kv_gathers) == {kv_sizes}
        assert gathers.count(losses) == MICRO_BATCHES
        # backward (gloo has no reduce-scatter): the K/V gradients summed over the group,
        # then the weight gradients once per step
        reduces = _calls(step, "all_reduce", "cp")
        assert sorted(reduces) == sorted([kv_sizes] * kv_tensors * MICRO_BATCHES + [grad_bytes])
