"""DeepSeek-V3's routing in training: the balancing bias moves, the same in every layout and on resume.

A tiny GPT whose MoE blocks route as DeepSeek-V3 does (8 experts, top-4 of the best 2 of 4
groups, sigmoid scores, the auxiliary-loss-free bias updated after every step, the routed
scaling factor, a shared expert) trains :data:`invariance_worker.STEPS` steps in one
process, with two expert-parallel ranks, on two pipeline stages (whose ranks sum the
counts of their own layers), on two tensor-parallel ranks (each counting every token) and
on two context-parallel ranks (each counting its chunks), in canonical units; the losses, evaluations and the final model (the bias a
buffer of it) and optimizer state are bit-identical. The expert-parallel run's checkpoint
of the middle step resumes in one process with the uninterrupted run's losses, bias
included.
"""

from __future__ import annotations

import shutil

import pytest

from epochal.train.state.checkpoint import step_folder_name
from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W

pytestmark = pytest.mark.distributed

HALF = W.STEPS // 2
DEEPSEEK = [
    "--model.num_experts=8",
    "--model.moe_router_topk=4",
    "--model.moe_ffn_hidden_size=32",
    "--model.moe_shared_expert_intermediate_size=32",
    "--model.moe_router_score_function=sigmoid",
    "--model.moe_router_enable_expert_bias=true",
    "--model.moe_router_bias_update_rate=0.01",
    "--model.moe_router_num_groups=4",
    "--model.moe_router_group_topk=2",
    "--model.moe_router_topk_scaling_factor=2.5",
    "--model.moe_aux_loss_coeff=0.001",
    # DeepSeek's first dense block: on two pipeline stages the first holds no MoE layer
    "--model.moe_layer_freq=[0, 1]",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("balancing-bias")


@pytest.fixture(scope="module")
def one(root):
    return W.single(str(root), "dp1", "gpt", DEEPSEEK)


#: weight gradients in 2 x 2 sequence chunks: CP2 gives the bits of this one-process run
C2 = ["--parallel.invariant_context_degree=2"]


@pytest.fixture(scope="module")
def one_c2(root):
    return W.single(str(root), "dp1-c2", "gpt", [*DEEPSEEK, *C2])


@pytest.fixture(scope="module")
def two(root):
    cases = [
        (
            "ep2",
            "gpt",
            [*DEEPSEEK, "--parallel.expert_parallel=2", f"--checkpoint.save_interval={HALF}"],
        ),
        ("pp2", "gpt", [*DEEPSEEK, "--parallel.pipeline_parallel=2"]),
        # both ranks count every token (the router is replicated): the signs are the same
        ("tp2", "gpt", [*DEEPSEEK, "--parallel.tensor_parallel=2"]),
        ("cp2", "gpt", [*DEEPSEEK, *C2, "--parallel.context_parallel=2"]),
    ]
    return run_gloo(W.rank_main, 2, str(root), cases, timeout=600)[0]


def _saved_biases(run_dir) -> list[str]:
    """The balancing biases' names in the run's last checkpoint."""
    from epochal.train.state.checkpoint import SafeFileSystemReader

    folder = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    metadata = SafeFileSystemReader(folder).read_metadata()
    return sorted({k.fqn for k in metadata.storage_data if k.fqn.endswith("mlp.expert_bias")})


@pytest.mark.parametrize("layout", ["ep2", "pp2", "tp2", "cp2"])
def test_the_layout_trains_the_bits_of_one_process(one, one_c2, two, layout):
    got = two[layout]
    one = one_c2 if layout == "cp2" else one
    assert len(one["losses"]) == W.STEPS
    assert got["losses"] == one["losses"]
    assert got["eval"] == one["eval"] and got["logged"] == one["logged"]
    assert got["digest"] == one["digest"]  # the balancing bias is in the model's state


def test_the_bias_is_saved_and_resumes_exactly(root, one, two):
    # every MoE block's bias is in the checkpoint
    assert _saved_biases(root / "ep2") == ["model.layers.1.mlp.expert_bias"]
    resumed = root / "ep2-on-ep1" / "checkpoints"
    resumed.mkdir(parents=True)
    name = step_folder_name(HALF)
    shutil.copytree(root / "ep2" / "checkpoints" / name, resumed / name)
    got = W.single(str(root), "ep2-on-ep1", "gpt", DEEPSEEK)
    assert got["losses"] == one["losses"][HALF:]
    assert got["digest"] == one["digest"]


def test_the_bias_moves_and_changes_the_routing(root, one):
    frozen = W.single(
        str(root), "frozen", "gpt", [*DEEPSEEK, "--model.moe_router_bias_update_rate=1e-12"]
    )
    assert frozen["losses"][0] == one["losses"][0]  # the same first step
    assert frozen["losses"] != one["losses"]  # then the bias moves the choice
