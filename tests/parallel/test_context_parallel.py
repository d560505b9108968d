"""Context parallelism (``parallel.context_parallel``) gives the single-process results.

Megatron's load-balanced chunks (checked against Megatron-Core's own
``get_batch_on_this_cp_rank``), the rank order and the refusals run in this process;
two launches (2 and 4 gloo ranks) compare tiny GPT runs at CP2, CP4, CP2 x DP2
(distributed optimizer) and CP2 x TP2 with sequence parallelism with one process (losses, evaluation loss, gradient norms and gradients within
1e-5 at every step), train a tiny ESM-2 (bidirectional, padded) at CP2 through the
trainer, and resume a CP2 checkpoint on one process and on CP4. Packed rows (GPT with
document masks, ESM-2 THD) at CP2 and (slow tier) CP4, CP2 x PP2 (training and
evaluation) and recompute (full, selective) at CP2 against one process.
"""

from __future__ import annotations

import pytest
import torch

from epochal.model import ConfigError
from epochal.parallel.config import ParallelConfig
from epochal.parallel.context_parallel import ContextParallel, chunk_positions
from epochal.parallel.dims import ParallelDims
from tests.dist_utils import run_gloo
from tests.parallel import cp_worker
from tests.parallel import harness as H

# ------------------------------------------------------------------ in process


@pytest.mark.parametrize("cp", [2, 4])
def test_chunks_are_megatron_core_s(cp, monkeypatch):
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    seq = 8 * cp
    tokens = torch.arange(3 * seq).view(3, seq)
    seen = []
    for rank in range(cp):
        monkeypatch.setattr(parallel_state, "get_context_parallel_world_size", lambda: cp)
        monkeypatch.setattr(parallel_state, "get_context_parallel_rank", lambda r=rank: r)
        theirs = get_batch_on_this_cp_rank({"tokens": tokens.clone()})["tokens"]
        ours = tokens.index_select(1, chunk_positions(seq, cp, rank))
        assert torch.equal(ours, theirs)
        seen.append(chunk_positions(seq, cp, rank))
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(seq))


def test_rank_order_keeps_tensor_parallel_innermost():
    dims = ParallelDims.from_config(ParallelConfig(tensor_parallel=2, context_parallel=2), 8)
    assert (dims.tp, dims.cp, dims.dp, dims.world_size) == (2, 2, 2, 8)
    assert [dims.coords(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [dims.coords(r)["cp"] for r in range(4)] == [0, 0, 1, 1]
    assert [dims.coords(r)["dp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ParallelConfig(context_parallel=2, data_parallel=3).launch_world_size() == 6


def _validate(
    seq: int = 32, cp: int = 2, pp: int = 1, exchange: str = "allgather", **model
) -> None:
    pc = ParallelConfig(
        context_parallel=cp, pipeline_parallel=pp, context_parallel_exchange=exchange
    )
    dims = ParallelDims.from_config(pc, cp * pp)
    config = cp_worker.gpt_config(max_position_embeddings=64, **model)
    dims.validate(config, micro_batch_size=1, global_batch_size=8, seq_length=seq, config=pc)


def test_refuses_what_it_does_not_support_by_name():
    _validate()  # the supported case passes
    with pytest.raises(ConfigError, match=r"context_parallel.*seq_length=30.*divisible by 4"):
        _validate(seq=30)
    _validate(pp=2, num_layers=2)  # pipeline stages exchange each rank's chunks
    # ALiBi and sliding windows: each head over the whole sequence (the exchange of heads)
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*alibi.*'a2a'"):
        _validate(position_embedding_type="alibi")
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*sliding_window.*'a2a'"):
        _validate(exchange="p2p", sliding_window=8)
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*sliding_window"):
        _validate(exchange="auto", sliding_window=8, num_query_groups=1)  # auto: the ring
    _validate(exchange="a2a", position_embedding_type="alibi")
    _validate(exchange="auto", sliding_window=8)  # auto: the heads split, a2a
    _validate(num_experts=2, moe_ffn_hidden_size=32)  # mixture of experts: supported
    with pytest.raises(ConfigError, match=r"context_parallel.*'relative' for T5"):
        _validate(type="t5", position_embedding_type="relative")
    with pytest.raises(ConfigError, match=r"context_parallel.*loss_fn"):
        ContextParallel.check_training(custom_loss=True)
    with pytest.raises(ConfigError, match=r"context_parallel"):
        ParallelConfig(context_parallel=0)
    _validate(exchange="a2a")  # 4 query heads and 2 key/value groups split over CP2
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*1 key/value heads"):
        _validate(exchange="a2a", num_query_groups=1)
    # multi-query attention under TP2: each tensor-parallel rank keeps the one group
    pc = ParallelConfig(tensor_parallel=2, context_parallel=2, context_parallel_exchange="a2a")
    mqa = cp_worker.gpt_config(max_position_embeddings=64, num_query_groups=1)
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*2 query and 1 key/value"):
        ParallelDims.from_config(pc, 4).validate(
            mqa, micro_batch_size=1, global_batch_size=8, seq_length=32, config=pc
        )
    with pytest.raises(ConfigError, match=r"context_parallel_exchange"):
        ParallelConfig(context_parallel_exchange="ring")
    _validate(exchange="p2p", num_query_groups=1)  # the ring: any head count
    with pytest.raises(ConfigError, match=r"context_parallel_exchange.*attention_dropout=0.1"):
        _validate(exchange="p2p", attention_dropout=0.1)


# ------------------------------------------------------------------ gloo ranks


@pytest.fixture(scope="module")
def cp_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("cp")


@pytest.fixture(scope="module")
def two_rank(cp_tmp):
    return run_gloo(cp_worker.two_rank_checks, 2, str(cp_tmp), timeout=900)


@pytest.fixture(scope="module")
def four_rank_packed(cp_tmp):
    return run_gloo(cp_worker.four_rank_packed_checks, 4, str(cp_tmp), timeout=900)


@pytest.fixture(scope="module")
def four_rank(cp_tmp, two_rank):
    return run_gloo(cp_worker.four_rank_checks, 4, str(cp_tmp), timeout=900)


def _close(a: list[float], b: list[float], rel: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


@pytest.mark.distributed
def test_cp2_gpt_matches_one_process(two_rank):
    for result in two_rank:
        assert result["gpt"]["problems"] == [], "\n".join(result["gpt"]["problems"])
        assert _close(result["gpt"]["losses"], result["gpt"]["ref"])


@pytest.mark.distributed
def test_cp2_esm_bidirectional_matches_one_process(two_rank, tmp_path):
    from tests.parallel import bert_worker

    extra = [*bert_worker.ESM, "--model.token_dropout=false"]
    ref = bert_worker.single(str(tmp_path / "one"), extra, variable=True)
    for result in two_rank:
        assert _close(result["esm"]["losses"], ref["losses"]), (result["esm"], ref)
        assert abs(result["esm"]["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])


@pytest.mark.distributed
def test_cp2_bert_binary_head_matches_one_process(two_rank, tmp_path):
    # the pooler reads the first token from the rank that holds it; only that rank
    # back-propagates the binary logits before the gradients are summed over the group
    from tests.parallel import bert_worker

    ref = bert_worker.single(str(tmp_path / "one"), bert_worker.PAIRS)
    for result in two_rank:
        assert _close(result["bert_pairs"]["losses"], ref["losses"]), (result["bert_pairs"], ref)
        assert abs(result["bert_pairs"]["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])
        for key, value in ref["logged"].items():
            assert result["bert_pairs"]["logged"][key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.distributed
@pytest.mark.slow  # four ranks: the canonical CP4 / CP2 x DP2 / CP2 x PP2 cover the default tier
def test_layout_invariant_with_cp_fixed_data_parallel_changes_nothing(two_rank, four_rank):
    # the trainer under training.layout_invariant (the presets' default): CP2 on two
    # processes (4 micro-batches per step) and CP2 x DP2 on four (2 each), bit for bit
    assert [r["esm_dp2"]["losses"] for r in four_rank] == [two_rank[0]["esm"]["losses"]] * 4
    assert [r["esm_dp2"]["eval"] for r in four_rank] == [two_rank[0]["esm"]["eval"]] * 4


@pytest.mark.distributed
@pytest.mark.slow  # four ranks: the canonical CP4 / CP2 x DP2 / CP2 x PP2 cover the default tier
def test_cp2_checkpoint_resumes_on_one_process_and_on_cp4(two_rank, four_rank, cp_tmp):
    steps = cp_worker.STEPS
    straight = H.reference_run(cp_worker.gpt_config(), H.global_batches(2 * steps, 8), 2)
    expected = straight["losses"][steps:]
    assert _close(cp_worker.resume_single(str(cp_tmp / "cp2"), steps), expected)
    for result in four_rank:
        assert _close(result["resume_cp4"], expected), (result["resume_cp4"], expected)


@pytest.mark.distributed
def test_cp2_by_an_all_to_all_of_heads_matches_one_process(two_rank, tmp_path):
    # parallel.context_parallel_exchange = "a2a": GPT (padded, and rows of documents) and
    # packed ESM-2 rows, each rank attending with whole heads over the whole sequence
    ref = _esm_packed_reference(tmp_path)
    # (ALiBi and sliding windows through the same exchange: test_layout_invariance.py)
    for result in two_rank:
        for name in ("gpt_a2a", "gpt_packed_a2a"):
            assert result[name]["problems"] == [], "\n".join(result[name]["problems"])
            assert _close(result[name]["losses"], result[name]["ref"])
        esm = result["esm_packed_a2a"]
        assert _close(esm["losses"], ref["losses"]), (esm, ref)
        assert abs(esm["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])


@pytest.mark.distributed
def test_cp2_by_a_ring_of_keys_and_values_matches_one_process(two_rank):
    # parallel.context_parallel_exchange = "p2p": keys and values passed around the ring
    for result in two_rank:
        assert result["gpt_p2p"]["problems"] == [], "\n".join(result["gpt_p2p"]["problems"])
        assert _close(result["gpt_p2p"]["losses"], result["gpt_p2p"]["ref"])


@pytest.mark.distributed
@pytest.mark.slow  # four ranks: the canonical CP4 / CP2 x DP2 / TP2 x CP2 cover the default tier
@pytest.mark.parametrize("name", ["cp4", "cp4_a2a", "cp4_p2p", "cp2_dp2", "cp2_tp2_sp"])
def test_four_rank_layouts_match_one_process(four_rank, name):
    for result in four_rank:
        assert result[name]["problems"] == [], "\n".join(result[name]["problems"])
        assert _close(result[name]["losses"], result[name]["ref"])


def _esm_packed_reference(tmp_path) -> dict:
    from tests.parallel import bert_worker

    extra = [*bert_worker.ESM, "--model.token_dropout=false", *cp_worker.PACKED_ROWS]
    return bert_worker.single(str(tmp_path / "one"), extra, variable=True)


@pytest.mark.distributed
def test_cp2_packed_rows_match_one_process(two_rank, tmp_path):
    # causal GPT rows of several documents (document masks, per-document positions) and
    # packed ESM-2 (THD, bidirectional, padded to a multiple of 4), 20 steps each
    ref = _esm_packed_reference(tmp_path)
    for result in two_rank:
        gpt = result["gpt_packed"]
        assert gpt["problems"] == [], "\n".join(gpt["problems"])
        assert len(gpt["losses"]) == cp_worker.LONG and _close(gpt["losses"], gpt["ref"])
        esm = result["esm_packed"]
        assert len(esm["losses"]) == cp_worker.LONG
        assert _close(esm["losses"], ref["losses"]), (esm, ref)
        assert abs(esm["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])


@pytest.mark.distributed
@pytest.mark.slow
def test_cp4_packed_rows_match_one_process(four_rank_packed, tmp_path):
    ref = _esm_packed_reference(tmp_path)
    for result in four_rank_packed:
        gpt = result["gpt_packed"]
        assert gpt["problems"] == [], "\n".join(gpt["problems"])
        assert _close(gpt["losses"], gpt["ref"])
        assert _close(result["esm_packed"]["losses"], ref["losses"])
        assert abs(result["esm_packed"]["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])


@pytest.mark.distributed
@pytest.mark.slow  # four ranks: the canonical CP4 / CP2 x DP2 / CP2 x PP2 cover the default tier
def test_cp2_pp2_matches_one_process_in_training_and_evaluation(four_rank):
    # harness.compare checks the evaluation loss (the pipeline's eval schedule) too
    for result in four_rank:
        assert result["cp2_pp2"]["problems"] == [], "\n".join(result["cp2_pp2"]["problems"])
        assert len(result["cp2_pp2"]["losses"]) == cp_worker.LONG
        assert _close(result["cp2_pp2"]["losses"], result["cp2_pp2"]["ref"])


@pytest.mark.distributed
@pytest.mark.parametrize("granularity", ["full", "selective"])
def test_cp2_with_recompute_matches_one_process(two_rank, granularity):
    for result in two_rank:
        problems = result[f"recompute_{granularity}"]["problems"]
        assert problems == [], "\n".join(problems)
