"""``parallel.backend = "gloo"`` with CUDA: ranks share GPUs for data parallelism only (issue 25).

The rank -> GPU mapping and the refusals are checked on the CPU with a faked CUDA
(``torch.cuda`` patched, no process group: one process); the multi-rank run itself
needs a GPU (README "On a GPU").
"""

from __future__ import annotations

import pytest
import torch

from epochal.model.config import ConfigError
from epochal.parallel.config import ParallelConfig
from epochal.parallel.launch import check_gloo_on_cuda, init_distributed


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        (dict(tensor_parallel=2), "parallel.tensor_parallel"),
        (dict(pipeline_parallel=2), "parallel.pipeline_parallel"),
        (dict(dp_sharding="optimizer"), "parallel.dp_sharding"),
        (dict(dp_sharding="full"), "parallel.dp_sharding"),
    ],
)
def test_gloo_on_cuda_refuses_what_gloo_cannot_run(kwargs, option):
    with pytest.raises(ConfigError, match="gloo") as err:
        check_gloo_on_cuda(ParallelConfig(backend="gloo", **kwargs))
    assert err.value.option == option


def test_gloo_on_cuda_allows_replicated_data_parallel():
    check_gloo_on_cuda(ParallelConfig(backend="gloo", data_parallel=4))


@pytest.fixture
def one_fake_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # no group is made
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 3)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    return chosen


def test_gloo_ranks_share_the_gpu(one_fake_gpu):
    info = init_distributed(ParallelConfig(backend="gloo"), "cuda")
    assert info.device == torch.device("cuda", 0) and one_fake_gpu == [0]
    with pytest.raises(ConfigError, match="parallel.dp_sharding"):
        init_distributed(ParallelConfig(backend="gloo", dp_sharding="full"), "cuda")


def test_nccl_ranks_beyond_the_gpus_are_refused_with_the_gloo_hint(one_fake_gpu):
    with pytest.raises(ValueError, match="LOCAL_RANK 3 has no GPU.*parallel.backend='gloo'"):
        init_distributed(ParallelConfig(backend="auto"), "cuda")
