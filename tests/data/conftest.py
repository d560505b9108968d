"""Fixtures shared by the Megatron-Core dataset peer tests (BERT, T5).

Megatron's masked datasets call ``torch.distributed.get_rank()`` unguarded (a one-process
gloo group is opened for them), and Megatron draws its permutation N-gram sizes from
numpy's global generator (seeded by the tests; restored after each test).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "filestore"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def keep_global_numpy_state():
    state = np.random.get_state()  # noqa: NPY002 - restored after each test
    yield
    np.random.set_state(state)  # noqa: NPY002
