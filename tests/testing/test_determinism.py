"""Tests of the Megatron determinism checks: each kind of global-RNG use is caught."""

import random

import numpy as np
import pytest
import torch
from torch import manual_seed as aliased_manual_seed

from epochal.data import EpochIndex, MaskedTokenDataset, MultiEpochDatasetResampler
from epochal.testing import (
    DatasetDistributedNondeterministic,
    DatasetLocallyNondeterministic,
    assert_dataset_compatible_with_megatron,
    assert_dataset_deterministic_across_processes,
    assert_dataset_elements_not_equal,
)


class Base:
    def __len__(self):
        return 4


class Good(Base):
    """Randomness from a local generator seeded by the index."""

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i)
        rng = np.random.default_rng(i)
        return {"x": torch.rand(3, generator=g), "y": rng.random(2), "meta": [i, ("a", 1.5)]}


class CallsAndReturns(Base):
    """Runs `action` (a global-RNG use) inside __getitem__ but returns a fixed sample."""

    def __init__(self, action):
        self.action = action

    def __getitem__(self, i):
        self.action(i)
        return torch.arange(3) + i


GLOBAL_USES = {
    "torch.manual_seed": lambda i: torch.manual_seed(i),
    "torch.random.manual_seed": lambda i: torch.random.manual_seed(i),
    "torch.cuda.manual_seed": lambda i: torch.cuda.manual_seed(i),
    "torch.cuda.manual_seed_all": lambda i: torch.cuda.manual_seed_all(i),
    "aliased manual_seed": lambda i: aliased_manual_seed(i),
    "np.random.seed": lambda i: np.random.seed(i),  # noqa: NPY002
    "random.seed": lambda i: random.seed(i),
    "torch.rand": lambda i: torch.rand(2),
    "torch.randn": lambda i: torch.randn(2),
    "torch.randint": lambda i: torch.randint(0, 10, (2,)),
    "torch.randperm": lambda i: torch.randperm(5),
    "torch.multinomial": lambda i: torch.multinomial(torch.ones(4), 2),
    "torch.bernoulli": lambda i: torch.bernoulli(torch.full((3,), 0.5)),
    "torch.normal": lambda i: torch.normal(torch.zeros(3), 1.0),
    "Tensor.uniform_": lambda i: torch.empty(3).uniform_(),
    "np.random.rand": lambda i: np.random.rand(2),  # noqa: NPY002
    "np.random.randint": lambda i: np.random.randint(0, 5),  # noqa: NPY002
    "np.random.permutation": lambda i: np.random.permutation(5),  # noqa: NPY002
    "np.random.choice": lambda i: np.random.choice(5),  # noqa: NPY002
    "random.random": lambda i: random.random(),
    "random.randint": lambda i: random.randint(0, 3),
    "random.shuffle": lambda i: random.shuffle([1, 2, 3]),
    "random.choice": lambda i: random.choice([1, 2, 3]),
}


@pytest.mark.parametrize("use", sorted(GLOBAL_USES))
def test_each_global_rng_use_is_caught(use):
    torch_before = torch.get_rng_state()
    np_before = np.random.get_state()[1].copy()  # noqa: NPY002
    py_before = random.getstate()
    # (torch._dynamo, imported by other tests, wraps torch.manual_seed itself: compare identity)
    functions = _seeding_functions()
    with pytest.raises(DatasetDistributedNondeterministic, match="global"):
        assert_dataset_compatible_with_megatron(CallsAndReturns(GLOBAL_USES[use]), index=1)
    # everything is restored: functions and the caller's generator states
    assert _seeding_functions() == functions
    assert torch.equal(torch.get_rng_state(), torch_before)
    assert np.array_equal(np.random.get_state()[1], np_before)  # noqa: NPY002
    assert random.getstate() == py_before


def test_seeding_call_is_named():
    with pytest.raises(DatasetDistributedNondeterministic, match=r"called torch\.manual_seed\(2\)"):
        assert_dataset_compatible_with_megatron(
            CallsAndReturns(GLOBAL_USES["torch.manual_seed"]), index=2
        )


def test_reading_global_state_is_caught():
    class ReadsSeed(Base):
        def __getitem__(self, i):
            return torch.initial_seed()

    with pytest.raises(DatasetDistributedNondeterministic, match="changed when the global"):
        assert_dataset_compatible_with_megatron(ReadsSeed())


def test_unseeded_draw_is_locally_nondeterministic():
    class Draws(Base):
        def __getitem__(self, i):
            return {"x": torch.rand(3)}

    with pytest.raises(DatasetLocallyNondeterministic, match=r"sample\['x'\]"):
        assert_dataset_compatible_with_megatron(Draws())


def test_fresh_entropy_generator_is_locally_nondeterministic():
    class Entropy(Base):
        def __getitem__(self, i):
            return np.random.default_rng().random(4)

    with pytest.raises(DatasetLocallyNondeterministic):
        assert_dataset_compatible_with_megatron(Entropy())


def test_good_dataset_passes_and_elements_differ():
    assert_dataset_compatible_with_megatron(Good(), index=0)
    assert_dataset_elements_not_equal(Good(), 0, 1)
    with pytest.raises(AssertionError, match="are equal"):
        assert_dataset_elements_not_equal(CallsAndReturns(lambda i: None), 1, 1)


def _seeding_functions():
    return [
        torch.manual_seed,
        torch.random.manual_seed,
        torch.cuda.manual_seed,
        torch.cuda.manual_seed_all,
        np.random.seed,
        random.seed,
    ]


def test_restored_when_dataset_raises():
    original = torch.manual_seed
    functions = _seeding_functions()

    class Raises(Base):
        def __getitem__(self, i):
            if torch.manual_seed is original:
                return 0  # the first (unpatched) calls succeed
            torch.manual_seed(5)
            raise KeyError("boom")

    before = torch.get_rng_state()
    with pytest.raises(KeyError, match="boom"):
        assert_dataset_compatible_with_megatron(Raises())
    assert _seeding_functions() == functions
    assert torch.equal(torch.get_rng_state(), before)


def test_empty_dataset_is_an_error():
    class Empty(Base):
        def __len__(self):
            return 0

    with pytest.raises(ValueError, match="empty"):
        assert_dataset_compatible_with_megatron(Empty())


class HashSeeded(Base):
    """Deterministic within a process, different across processes (str hashing is salted)."""

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(hash(f"item-{i}") % 2**32)
        return torch.rand(2, generator=g)


def _masked_resampler():
    seqs = [list(range(4, 40)), list(range(10, 60)), list(range(5, 25))]
    masked = MaskedTokenDataset(
        seqs, mask_token_id=1, random_tokens=range(4, 60), special_token_ids=[2]
    )
    return MultiEpochDatasetResampler(masked, num_epochs=3, seed=7)


def test_other_process_same_samples_for_resampled_masking():
    ds = _masked_resampler()
    assert_dataset_compatible_with_megatron(ds, index=5)
    assert_dataset_deterministic_across_processes(ds, indices=[0, 4, 8])


def test_other_process_catches_per_process_state():
    ds = HashSeeded()
    assert_dataset_compatible_with_megatron(ds, index=1)  # in-process checks cannot see it
    with pytest.raises(DatasetDistributedNondeterministic, match="fresh"):
        assert_dataset_compatible_with_megatron(ds, index=1, check_other_process=True)


def test_other_process_needs_a_picklable_dataset():
    class Local(Base):
        def __getitem__(self, i):
            return i

    with pytest.raises(TypeError, match="picklable.*importable by a fresh Python process"):
        assert_dataset_deterministic_across_processes(Local())


def test_multi_epoch_keys():
    ds = _masked_resampler().dataset
    assert_dataset_elements_not_equal(ds, EpochIndex(0, 1), EpochIndex(1, 1))


class MainDataset(Base):
    def __getitem__(self, i):
        return i


def test_other_process_names_a_class_defined_in_main(monkeypatch):
    # picklable here (pickle finds __main__.MainDataset), but a fresh process cannot import it
    import sys

    monkeypatch.setattr(MainDataset, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "MainDataset", MainDataset, raising=False)
    with pytest.raises(
        TypeError, match=r"importable by a fresh Python process, not just picklable"
    ):
        assert_dataset_deterministic_across_processes(MainDataset())
    wrapped = MultiEpochDatasetResampler(MainDataset(), num_epochs=2, seed=1)  # nested: found too
    with pytest.raises(TypeError, match=r"not importable: __main__\.MainDataset"):
        assert_dataset_compatible_with_megatron(wrapped, index=0, check_other_process=True)


def test_other_process_explains_a_class_the_child_cannot_import(tmp_path, monkeypatch):
    # importable here, not in the child (different RANK): the child's error says why
    (tmp_path / "rank_zero_only.py").write_text(
        "import os\n"
        "if os.environ.get('RANK', '0') != '0':\n"
        "    raise ImportError('only importable on rank 0')\n"
        "class Data:\n"
        "    def __len__(self):\n"
        "        return 2\n"
        "    def __getitem__(self, i):\n"
        "        return i\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("RANK", raising=False)
    import rank_zero_only

    with pytest.raises(RuntimeError, match="needs the dataset's classes to be importable") as info:
        assert_dataset_deterministic_across_processes(rank_zero_only.Data())
    assert "only importable on rank 0" in str(info.value)
