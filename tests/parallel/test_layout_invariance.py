"""The same bits on 1, 2 or 4 data-parallel ranks: losses, evaluations, weights and optimizer state.

Tiny GPT (dropout on), BERT (dropout on), T5 (dropout on) and ESM-2 models train
20 steps (10 in the default test tier) with a global batch of four micro-batches of two samples: in one
process (DP1 x GA4, the plain :class:`~epochal.train.trainer.Trainer`), on two
data-parallel ranks (DP2 x GA2) and on four (DP4 x GA1), with every
``dp_sharding`` mode and activation recompute spread over the runs; then
pipeline parallelism (PP2 x DP2 against one process, tied embeddings) and
tensor and context parallelism (GPT in canonical units, ``parallel.invariant_degree``:
TP2, TP2 with sequence parallelism, TP4 with it, TP2 x DP2 with the distributed
optimizer, TP2 x PP2, CP2, CP4, CP2 x DP2, TP2 x CP2 with sequence parallelism and CP2 x PP2
(ESM-2 too), QK-norm in TP4, CP2, CP4, TP2 x CP2 and CP2 x PP2; BERT (pairs with the binary head, also with sequence
parallelism), ESM-2 at TP2 with sequence parallelism, packed ESM-2 (token dropout on,
rows of several proteins) and Megatron's T5 at TP2, Hugging Face's T5 v1.1 too in the slow tier; ESM-2
(padded and packed, token dropout on) and BERT's pairs (the binary head) at CP2, every
one against one process). Every loss list is compared
with ``==``, the final model and optimizer state by a digest of their full
tensors. A checkpoint written on four ranks resumes in one process, and one
written in one process resumes on two ranks, with the losses of the run that
never stopped. A control run with ``training.layout_invariant=false`` shows that
the comparison sees the drift of the plain reduction.

Every process computes with one thread (the kernels' bits depend on the thread
count). One launch per process count runs all its cases
(:mod:`tests.parallel.invariance_worker`).
"""

from __future__ import annotations

import os
import shutil

import pytest

from epochal.train.state.checkpoint import step_folder_name
from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W
from tests.parallel import t5_worker

pytestmark = pytest.mark.distributed

MODELS = ["gpt", "bert", "t5", "esm"]
HALF = W.STEPS // 2
SAVE = [f"--checkpoint.save_interval={HALF}"]
RECOMPUTE = ["--parallel.recompute_granularity=full"]
SP = ["--parallel.sequence_parallel=true"]
# key/value groups split over four ranks, QK-norm (its weight shared by heads split over ranks)
G4 = ["--model.num_query_groups=4", "--model.qk_layernorm=true"]
# weight gradients summed in 2 x 4 sequence chunks: CP2 and CP4 give the bits of one process
CTX4 = ["--parallel.invariant_context_degree=4"]
CP2 = ["--parallel.context_parallel=2", *CTX4]
CTX2 = ["--parallel.invariant_context_degree=2"]
T5_HF = t5_worker.HF_STYLE
PACKED = ["--data.pack_sequences=true"]  # ESM-2 with token dropout, rows of several proteins
# ALiBi and a sliding window (no attention dropout: keyed masks do not take them)
POSITIONAL = [
    "--model.position_embedding_type=alibi",
    "--model.sliding_window=8",
    "--model.attention_dropout=0.0",
    *CTX2,
]
SLOW_TIER = os.environ.get("EPOCHAL_SLOW_TESTS", "") not in ("", "0")
# (name, model, overrides): the sharding modes and recompute spread over the models
TWO = [
    ("dp2-gpt", "gpt", SAVE),
    ("dp2-bert", "bert", ["--parallel.dp_sharding=optimizer"]),
    ("dp2-t5", "t5", ["--parallel.dp_sharding=full"]),
    ("tp2", "gpt", ["--parallel.tensor_parallel=2"]),
    ("tp2-sp", "gpt", ["--parallel.tensor_parallel=2", "--parallel.sequence_parallel=true"]),
    ("tp2-degree1", "gpt", ["--parallel.tensor_parallel=2", "--parallel.invariant_degree=1"]),
    ("cp2", "gpt", [*CP2, *G4]),
    ("tp2-bert", "bert", ["--parallel.tensor_parallel=2"]),
    ("tp2-esm-packed", "esm", ["--parallel.tensor_parallel=2", *PACKED]),
    ("cp2-esm-packed", "esm", [*CP2, *PACKED]),
    ("cp2-alibi-window", "gpt", ["--parallel.context_parallel=2", *POSITIONAL]),
    # the slow tier: ESM-2 on DP2, padded ESM-2 and BERT's pairs at CP2, BERT and ESM-2
    # with SP (the default tier's packed ESM-2 at CP2 and TP2, BERT at TP2 cover their
    # machinery)
    *(
        [
            ("dp2-esm", "esm", RECOMPUTE),
            ("cp2-esm", "esm", CP2),
            ("cp2-bert", "bert", CP2),
            ("tp2-sp-bert", "bert", ["--parallel.tensor_parallel=2", *SP]),
            ("tp2-sp-esm", "esm", ["--parallel.tensor_parallel=2", *SP]),
        ]
        if SLOW_TIER
        else []
    ),
    ("tp2-t5", "t5", ["--parallel.tensor_parallel=2"]),
    ("dp2-plain", "gpt", ["--training.layout_invariant=false"]),
    # both sequence chunks of each weight gradient on every rank: each chunk accumulated
    # in the ordered reduction, the two added once per step (a CP2 run resumed on DP2)
    ("dp2-c2", "gpt", [*G4, *CTX2, "--parallel.dp_sharding=optimizer"]),
    # the slow tier: Hugging Face's T5 v1.1 (relative bias, RMSNorm, gated GELU, untied head)
    *([("tp2-t5-hf", "t5", ["--parallel.tensor_parallel=2", *T5_HF])] if SLOW_TIER else []),
]
#: the slow tier also runs BERT, T5 and ESM-2 on four data-parallel ranks (two ranks and
#: the GPT model's four cover the rule in the default tier)
FOUR_DP_SLOW = [
    ("dp4-bert", "bert", ["--parallel.dp_sharding=full", *RECOMPUTE]),
    ("dp4-t5", "t5", ["--parallel.dp_sharding=optimizer"]),
    ("dp4-esm", "esm", []),
]
FOUR = [
    ("dp4-gpt", "gpt", SAVE),
    *(FOUR_DP_SLOW if SLOW_TIER else []),
    # a CP2 run's two sequence chunks of each weight gradient on every rank: each chunk
    # through the ordered reduction, the schedule's set-up backward kept out of them
    ("pp2-dp2", "gpt", ["--parallel.pipeline_parallel=2", *RECOMPUTE, *G4, *CTX2]),
    ("tp2-dp2", "gpt", ["--parallel.tensor_parallel=2", "--parallel.dp_sharding=optimizer"]),
    (
        "tp4-sp",
        "gpt",
        ["--parallel.tensor_parallel=4", "--parallel.sequence_parallel=true", *G4, *CTX4],
    ),
    ("cp4", "gpt", ["--parallel.context_parallel=4", *G4, *CTX4]),
    # one sequence chunk pair per rank: its weight gradients accumulated in the global
    # micro-batch order by the data-parallel reduction, completed over CP once per step
    ("cp2-dp2", "gpt", ["--parallel.context_parallel=2", *G4, *CTX2]),
    ("tp2-cp2-sp", "gpt", ["--parallel.tensor_parallel=2", *CP2, *SP, *G4]),
    # each stage's inputs cut on the way in, its activations this rank's chunks
    ("cp2-pp2", "gpt", [*CP2, "--parallel.pipeline_parallel=2", *G4]),
    *([("cp2-pp2-esm", "esm", [*CP2, "--parallel.pipeline_parallel=2"])] if SLOW_TIER else []),
    (
        "tp2-pp2",
        "gpt",
        ["--parallel.tensor_parallel=2", "--parallel.pipeline_parallel=2", *SP],
    ),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The runs' folder, with the T5 corpus written."""
    path = tmp_path_factory.mktemp("invariance")
    W.prepare(str(path / "data"))
    return path


@pytest.fixture(scope="module")
def dp1(root):
    """One process (DP1 x GA4) per model; the GPT run saves a checkpoint half-way."""
    # (padded ESM-2's reference: only the slow tier's cases read it)
    models = [m for m in MODELS if m != "esm" or SLOW_TIER]
    runs = {m: W.single(str(root), f"dp1-{m}", m, SAVE if m == "gpt" else []) for m in models}
    runs["gpt-g4"] = W.single(str(root), "dp1-gpt-g4", "gpt", [*G4, *CTX4])
    runs["gpt-g4-c2"] = W.single(str(root), "dp1-gpt-g4-c2", "gpt", [*G4, *CTX2])
    runs["esm-packed"] = W.single(str(root), "dp1-esm-packed", "esm", PACKED)
    runs["gpt-alibi-window"] = W.single(str(root), "dp1-gpt-alibi-window", "gpt", POSITIONAL)
    if SLOW_TIER:
        runs["t5-hf"] = W.single(str(root), "dp1-t5-hf", "t5", T5_HF)
    return runs


@pytest.fixture(scope="module")
def two(root, dp1):
    """The two-rank cases, and the GPT run of one process resumed half-way on two ranks."""
    checkpoint = root / "dp1-gpt" / "checkpoints" / step_folder_name(HALF)
    resume = ("dp1-on-dp2", "gpt", [f"--checkpoint.resume={checkpoint}"])
    return run_gloo(W.rank_main, 2, str(root), [*TWO, resume], timeout=900)[0]


@pytest.fixture(scope="module")
def four(root):
    """The four-rank cases (the GPT run saves a checkpoint half-way)."""
    return run_gloo(W.rank_main, 4, str(root), FOUR, timeout=900)[0]


def assert_same(got: dict, want: dict) -> None:
    assert got["losses"] == want["losses"]
    assert got["eval"] == want["eval"] and len(want["eval"]) == 2
    assert got["logged"] == want["logged"]
    assert got["digest"] == want["digest"]


@pytest.mark.parametrize(
    "model",
    # ESM-2 on two data-parallel ranks in the slow tier (its packed rows at TP2 and CP2,
    # and CP2 x PP2, keep it in the default one)
    [pytest.param(m, marks=pytest.mark.slow) if m == "esm" else m for m in MODELS],
)
def test_two_data_parallel_ranks_train_the_bits_of_one_process(dp1, two, model):
    assert len(dp1[model]["losses"]) == W.STEPS
    assert_same(two[f"dp2-{model}"], dp1[model])


@pytest.mark.parametrize(
    "model", ["gpt", *(pytest.param(m, marks=pytest.mark.slow) for m in MODELS[1:])]
)
def test_four_data_parallel_ranks_train_the_bits_of_one_process(dp1, four, model):
    assert_same(four[f"dp4-{model}"], dp1[model])


def test_pipeline_and_data_parallel_equal_one_process(dp1, four):
    assert_same(four["pp2-dp2"], dp1["gpt-g4-c2"])


@pytest.mark.parametrize("case", ["tp2", "tp2-sp"])
def test_two_tensor_parallel_ranks_train_the_bits_of_one_process(dp1, two, case):
    assert_same(two[case], dp1["gpt"])


@pytest.mark.parametrize("case", ["tp2-dp2", "tp2-pp2"])
def test_tensor_parallel_with_data_or_pipeline_parallel_equals_one_process(dp1, four, case):
    assert_same(four[case], dp1["gpt"])


def test_four_tensor_parallel_ranks_with_sequence_parallel_equal_one_process(dp1, four):
    assert_same(four["tp4-sp"], dp1["gpt-g4"])


@pytest.mark.parametrize(
    "model", ["bert", "esm-packed", "t5", pytest.param("t5-hf", marks=pytest.mark.slow)]
)
def test_two_tensor_parallel_ranks_train_a_bert_esm2_or_t5_model_as_one_process(dp1, two, model):
    assert_same(two[f"tp2-{model}"], dp1[model])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["bert", "esm"])
def test_sequence_parallel_bert_or_esm2_trains_the_bits_of_one_process(dp1, two, model):
    # BERT: pairs with the binary head, post-LN; ESM-2: token dropout. The embedding stage
    # whole on every rank (this rank's slice kept after its dropout), the heads gathered
    assert_same(two[f"tp2-sp-{model}"], dp1[model])


def test_two_context_parallel_ranks_train_the_bits_of_one_process(dp1, two):
    assert_same(two["cp2"], dp1["gpt-g4"])


@pytest.mark.parametrize(
    "model",
    [
        pytest.param("esm", marks=pytest.mark.slow),
        "esm-packed",
        pytest.param("bert", marks=pytest.mark.slow),
    ],
)
def test_two_context_parallel_ranks_train_a_bert_or_esm2_model_as_one_process(dp1, two, model):
    # heads exchanged, each attending over the whole sequence (padded: the padding mask
    # gathered; packed: within each protein); ESM-2's token dropout counted per whole
    # sequence; BERT's pairs pool the first token from the rank that holds it
    assert_same(two[f"cp2-{model}"], dp1[model])


@pytest.mark.parametrize("case", ["cp4", "tp2-cp2-sp", "cp2-pp2"])
def test_four_context_or_tensor_and_context_parallel_ranks_equal_one_process(dp1, four, case):
    assert_same(four[case], dp1["gpt-g4"])


def test_context_and_data_parallel_equal_one_process(dp1, four):
    assert_same(four["cp2-dp2"], dp1["gpt-g4-c2"])


def test_context_parallel_alibi_and_a_sliding_window_train_the_bits_of_one_process(dp1, two):
    """Each rank's head group over the whole sequence: its ALiBi slopes, the window's mask."""
    assert_same(two["cp2-alibi-window"], dp1["gpt-alibi-window"])


def test_data_parallel_ranks_holding_every_sequence_chunk_equal_one_process(dp1, two):
    """A CP2 run's order on DP2: each rank's two chunk accumulators reduced in the global order."""
    assert_same(two["dp2-c2"], dp1["gpt-g4-c2"])


@pytest.mark.slow  # GPT's CP2 x PP2 stays in the default tier
def test_context_and_pipeline_parallel_esm2_trains_the_bits_of_one_process(dp1, four):
    # the first stage's cut counts ESM-2's token dropout on the whole sequences
    assert_same(four["cp2-pp2-esm"], dp1["esm"])


def test_without_canonical_units_tensor_parallel_drifts(dp1, two):
    # invariant_degree=1: the plain tensor-parallel products, which the comparison sees
    assert two["tp2-degree1"]["losses"] != dp1["gpt"]["losses"]


def test_the_comparison_sees_the_plain_reduction(dp1, two):
    # without layout invariance two ranks drift from one process (and draw other masks)
    assert two["dp2-plain"]["losses"] != dp1["gpt"]["losses"]
    assert two["dp2-plain"]["digest"] != dp1["gpt"]["digest"]


def test_a_one_process_checkpoint_continues_on_two_ranks(dp1, two):
    resumed, reference = two["dp1-on-dp2"], dp1["gpt"]
    assert resumed["losses"] == reference["losses"][HALF:]
    assert resumed["eval"] == reference["eval"]  # the first one restored from the checkpoint
    assert resumed["digest"] == reference["digest"]


def test_a_four_rank_checkpoint_continues_in_one_process(root, dp1, four):
    resumed = root / "dp4-on-dp1" / "checkpoints"
    resumed.mkdir(parents=True)
    name = step_folder_name(HALF)
    shutil.copytree(root / "dp4-gpt" / "checkpoints" / name, resumed / name)
    got, reference = W.single(str(root), "dp4-on-dp1", "gpt"), dp1["gpt"]
    assert got["losses"] == reference["losses"][HALF:]
    assert got["eval"] == reference["eval"]
    assert got["digest"] == reference["digest"]
