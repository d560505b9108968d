"""Activation recompute in the single-process trainer (issue 25: it was silently ignored).

``parallel.recompute_granularity`` must change what the backward keeps, never the
losses: selective and full recompute give the losses of no recompute, bit for bit
(CPU), and keep fewer bytes of activations for the backward.
"""

from __future__ import annotations

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from epochal.parallel.recompute import unwrap_block
from epochal.parallel.step_plan import StepPlan
from tests.train.test_trainer import trainer

GRANULARITIES = {
    "none": [],
    "selective": ["--parallel.recompute_granularity=selective"],
    "full": ["--parallel.recompute_granularity=full"],
    "full-2": ["--parallel.recompute_granularity=full", "--parallel.recompute_num_layers=2"],
    "block-1": [
        "--parallel.recompute_granularity=full",
        "--parallel.recompute_method=block",
        "--parallel.recompute_num_layers=1",
    ],
}


class _LiveActivations(TorchDispatchMode):
    """Records the storage of every tensor an op creates (weakly), to count what stays alive."""

    def __init__(self) -> None:
        super().__init__()
        self.created: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.created[storage._cdata] = (StorageWeakRef(storage), storage.nbytes())
        return out

    def alive_bytes(self) -> int:
        return sum(n for ref, n in self.created.values() if not ref.expired())


def _saved_bytes(tr) -> int:
    """Bytes of activations one forward (one micro-batch) leaves alive for the backward.

    Counted as the storages created during the forward that are still alive after it:
    what autograd saved, recompute regions' stored inputs and selective recompute's
    kept matmul outputs (``saved_tensors_hooks`` alone would not see the latter:
    checkpointing installs its own hooks inside a region).
    """
    batch = tr.step_batch(next(iter(tr.data.train_loader.stream())))
    mode = _LiveActivations()
    with mode:
        loss = tr.run_step(batch, StepPlan.evaluation(1))
    alive = mode.alive_bytes()
    loss.backward()
    return alive


def _cfg_extra():
    return ["--model.num_layers=4", "--model.hidden_dropout=0.1", "--model.attention_dropout=0.1"]


def test_recompute_is_applied_and_keeps_fewer_activations(tmp_path):
    saved = {}
    for name, extra in GRANULARITIES.items():
        tr = trainer(tmp_path / name, *_cfg_extra(), *extra)
        layers = tr.model_parts[0].layers
        wrapped = [key for key, module in layers.items() if unwrap_block(module) is not module]
        expected = {"none": 0, "selective": 4, "full": 4, "full-2": 4, "block-1": 1}[name]
        assert len(wrapped) == expected, (name, wrapped)
        saved[name] = _saved_bytes(tr)
    assert saved["selective"] < saved["none"]
    assert saved["full"] < saved["selective"]
    assert saved["full-2"] < saved["full"]  # one stored input per group of two layers
    assert saved["full"] < saved["block-1"] < saved["none"]


@pytest.mark.parametrize("name", ["selective", "full-2", "block-1"])
def test_recompute_gives_the_losses_of_no_recompute(tmp_path, name):
    ref = trainer(tmp_path / "none", *_cfg_extra()).train()
    got = trainer(tmp_path / name, *_cfg_extra(), *GRANULARITIES[name]).train()
    assert got.losses == ref.losses  # dropout masks replayed: bit for bit on the CPU
    assert got.eval_loss == ref.eval_loss
