"""Expert parallelism trains the bits of one process, and its checkpoints load under any EP size.

The tiny MoE GPT of ``test_moe_layouts.py`` (4 experts, top-2, the balance and z-losses
on, dropout on) trains ``invariance_worker.STEPS`` steps (20, or 10 in the default tier) in one process (DP1 x GA4) and with
``parallel.expert_parallel=2`` on two data-parallel ranks (each holds two experts,
tokens travel by all-to-all): losses, evaluations, logged values and the final model
and optimizer state are bit-identical. Its checkpoint of the middle step resumes in one
process with the losses of the run that never stopped. Four ranks (the slow tier: one
launch of about a minute on two cores): EP2 x DP4 (expert weights reduced over two
expert-data-parallel ranks), EP2 x PP2 and the EP2 checkpoint resumed under EP4.
Without layout invariance EP2 stays within float32 rounding of plain DP2. In canonical
units TP2 with sequence parallelism (each expert's linears split over the pair) and CP2
(the layer computed on the gathered sequence) train the bits of one process too. The
communication ledger counts the all-to-all bytes of a step.
"""

from __future__ import annotations

import shutil

import pytest

from epochal.model.config import ConfigError, ModelConfig
from epochal.parallel.config import ParallelConfig
from epochal.parallel.dims import ParallelDims
from epochal.train.state.checkpoint import step_folder_name
from tests.dist_utils import run_gloo
from tests.parallel import ep_worker
from tests.parallel import invariance_worker as W
from tests.parallel.test_moe_layouts import MOE

pytestmark = pytest.mark.distributed

HALF = W.STEPS // 2
EP2 = [*MOE, "--parallel.expert_parallel=2"]
RECOMPUTE = ["--parallel.recompute_granularity=full"]
PLAIN = ["--training.layout_invariant=false", "--training.train_iters=5"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("expert-parallel")


@pytest.fixture(scope="module")
def one(root):
    return W.single(str(root), "dp1", "gpt", MOE)


#: weight gradients in 2 x 2 sequence chunks: CP2 gives the bits of this one-process run
C2 = ["--parallel.invariant_context_degree=2"]


@pytest.fixture(scope="module")
def one_c2(root):
    return W.single(str(root), "dp1-c2", "gpt", [*MOE, *C2])


@pytest.fixture(scope="module")
def two(root):
    cases = [
        ("ep2", "gpt", [*EP2, f"--checkpoint.save_interval={HALF}"]),
        ("ep2-plain", "gpt", [*EP2, *PLAIN]),
        ("dp2-plain", "gpt", [*MOE, *PLAIN]),
        (
            "tp2-sp",
            "gpt",
            [*MOE, "--parallel.tensor_parallel=2", "--parallel.sequence_parallel=true"],
        ),
        ("cp2", "gpt", [*MOE, *C2, "--parallel.context_parallel=2"]),
    ]
    ranks = run_gloo(ep_worker.rank_main, 2, str(root), cases, timeout=600)
    return {**ranks[0], "ledgers": [r["ledger"] for r in ranks]}


@pytest.fixture(scope="module")
def four(root, two):
    checkpoint = root / "ep2" / "checkpoints" / step_folder_name(HALF)
    cases = [
        # DP4 x GA1: two ranks hold each expert; the distributed optimizer and recompute
        ("ep2-dp4", "gpt", [*EP2, "--parallel.dp_sharding=optimizer", *RECOMPUTE]),
        ("ep2-pp2", "gpt", [*EP2, "--parallel.pipeline_parallel=2"]),
        (
            "ep2-on-ep4",
            "gpt",
            [*MOE, "--parallel.expert_parallel=4", f"--checkpoint.resume={checkpoint}"],
        ),
    ]
    return run_gloo(W.rank_main, 4, str(root), cases, timeout=900)[0]


def test_two_expert_parallel_ranks_train_the_bits_of_one_process(one, two):
    assert len(one["losses"]) == W.STEPS
    got = two["ep2"]
    assert got["losses"] == one["losses"]
    assert got["eval"] == one["eval"] and len(one["eval"]) == 2
    assert got["logged"] == one["logged"]  # balance loss, z-loss, tokens per expert
    assert got["digest"] == one["digest"]


def test_two_tensor_parallel_ranks_train_the_bits_of_one_process_in_canonical_units(one, two):
    # each expert's linears split over the pair, their products in the canonical chunks;
    # under sequence parallelism the layer reads the gathered sequence, keeps its slice
    got = two["tp2-sp"]
    assert got["losses"] == one["losses"]
    assert got["eval"] == one["eval"] and got["logged"] == one["logged"]
    assert got["digest"] == one["digest"]


def test_two_context_parallel_ranks_train_the_bits_of_one_process_in_canonical_units(one_c2, two):
    # the layer computed on the gathered sequence on both ranks, each keeping its chunks
    got = two["cp2"]
    assert got["losses"] == one_c2["losses"]
    assert got["eval"] == one_c2["eval"] and got["logged"] == one_c2["logged"]
    assert got["digest"] == one_c2["digest"]


def test_each_rank_holds_and_saves_only_its_experts(root, two):
    from epochal.train.state.checkpoint import SafeFileSystemReader

    folder = root / "ep2" / "checkpoints" / step_folder_name(HALF)
    metadata = SafeFileSystemReader(folder).read_metadata()
    files: dict[str, set[str]] = {}
    for index, info in metadata.storage_data.items():
        files.setdefault(index.fqn, set()).add(info.relative_path)
    for e, writer in ((0, "__0_"), (1, "__0_"), (2, "__1_"), (3, "__1_")):
        paths = files[f"model.layers.1.mlp.experts.{e}.w1.weight"]
        assert all(p.startswith(writer) for p in paths), (e, paths)


def test_an_expert_parallel_checkpoint_resumes_in_one_process(root, one, two):
    resumed = root / "ep2-on-ep1" / "checkpoints"
    resumed.mkdir(parents=True)
    name = step_folder_name(HALF)
    shutil.copytree(root / "ep2" / "checkpoints" / name, resumed / name)
    got = W.single(str(root), "ep2-on-ep1", "gpt", MOE)
    assert got["losses"] == one["losses"][HALF:]
    assert got["eval"] == one["eval"]
    assert got["digest"] == one["digest"]


def test_without_layout_invariance_expert_parallel_stays_within_rounding_of_dp2(two):
    ep, dp = two["ep2-plain"]["losses"], two["dp2-plain"]["losses"]
    assert len(ep) == len(dp) == 5
    assert max(abs(a - b) for a, b in zip(ep, dp)) < 1e-5  # measured: 4.8e-7 over 20 steps


def test_the_ledger_counts_the_all_to_all_bytes_of_a_step(two):
    w = ep_worker
    tokens = w.MBS * w.SEQ
    rows = tokens * w.TOPK  # dropless top-2: every assignment travels (to this rank or the other)
    # per MoE layer and micro-batch: the counts (E int64), dispatch and combine forward and
    # backward; a rank sends its own rows (dispatch) and the rows its experts received
    # (combine): summed over the two ranks, both are the ranks' rows
    calls = w.LAYERS * w.MICRO_BATCHES * 5
    size = 2 * w.LAYERS * w.MICRO_BATCHES * (w.EXPERTS * 8 + 4 * rows * w.HIDDEN * 4)
    ledgers = two["ledgers"]
    assert [led[("all_to_all", "ep")][0] for led in ledgers] == [calls, calls]
    assert sum(led[("all_to_all", "ep")][1] for led in ledgers) == size
    assert ("all_to_all", "dp") in ledgers[0]  # the ordered gradient exchange keeps its name


@pytest.mark.slow
def test_expert_data_parallel_ranks_train_the_bits_of_one_process(one, four):
    got = four["ep2-dp4"]
    assert got["losses"] == one["losses"]
    assert got["eval"] == one["eval"] and got["logged"] == one["logged"]
    assert got["digest"] == one["digest"]


@pytest.mark.slow
def test_expert_and_pipeline_parallel_train_the_bits_of_one_process(one, four):
    got = four["ep2-pp2"]
    assert got["losses"] == one["losses"]
    assert got["eval"] == one["eval"]
    assert got["digest"] == one["digest"]


@pytest.mark.slow
def test_an_ep2_checkpoint_resumes_on_four_expert_parallel_ranks(one, four):
    got = four["ep2-on-ep4"]
    assert got["losses"] == one["losses"][HALF:]
    assert got["eval"] == one["eval"]
    assert got["digest"] == one["digest"]


def _moe(num_experts: int | None = 4) -> ModelConfig:
    return ModelConfig(
        vocab_size=64,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        num_experts=num_experts,
    )


def test_expert_parallel_must_divide_the_data_parallel_size():
    with pytest.raises(ConfigError, match="parallel.expert_parallel.*data-parallel size 6"):
        ParallelDims.from_config(ParallelConfig(expert_parallel=4), 6)


@pytest.mark.parametrize(
    ("experts", "message"), [(6, "must divide model.num_experts=6"), (None, "num_experts")]
)
def test_expert_parallel_must_divide_the_experts_of_a_moe_model(experts, message):
    dims = ParallelDims.from_config(ParallelConfig(expert_parallel=4), 4)
    with pytest.raises(ConfigError, match=f"parallel.expert_parallel.*{message}"):
        dims.validate(_moe(experts), micro_batch_size=1, global_batch_size=4, seq_length=16)
