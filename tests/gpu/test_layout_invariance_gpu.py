"""On CUDA (marked ``gpu``): two data-parallel ranks sharing one GPU train the bits of one process.

With ``training.deterministic_kernels`` the GPU's kernels give the same bits on
every run, so the only thing left that could tell the layouts apart is the
reduction, which ``training.layout_invariant`` fixes: a tiny GPT with dropout
trains 12 steps in one process and on two gloo ranks on the same GPU (the only
data-parallel mode gloo runs on CUDA: replicated parameters), and the losses,
evaluation and final model and optimizer state must be equal bit for bit. The
CPU twin is ``tests/parallel/test_layout_invariance.py``.
"""

from __future__ import annotations

import pytest

from tests.dist_utils import run_gloo
from tests.parallel import invariance_worker as W

pytestmark = pytest.mark.gpu

CUDA = [
    "--training.device=cuda",
    "--parallel.backend=gloo",
    "--training.deterministic_kernels=true",
    "--training.train_iters=12",
    "--training.eval_interval=6",
    "--model.hidden_size=64",
]


def test_two_ranks_on_one_gpu_equal_one_process(tmp_path):
    # the reference in a process of its own too: cuBLAS reads CUBLAS_WORKSPACE_CONFIG once
    (reference,) = run_gloo(W.single_rank, 1, str(tmp_path), "dp1", "gpt", CUDA, timeout=300)
    ranks = run_gloo(W.rank_main, 2, str(tmp_path), [("dp2", "gpt", CUDA)], "cuda", timeout=300)
    got = ranks[0]["dp2"]
    assert len(reference["losses"]) == 12
    assert got["losses"] == reference["losses"]
    assert got["eval"] == reference["eval"]
    assert got["digest"] == reference["digest"]
