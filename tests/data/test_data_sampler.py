"""MegatronDataSampler: configuration errors, loader transformation, exact consumed-sample accounting."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from epochal.data import (
    MegatronDataSampler,
    MegatronPretrainingBatchSampler,
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    SamplerConfigError,
    WrappedDataLoader,
)
from epochal.data.loading.data_sampler import DataSamplerConfigError
from tests.data.resumable_helpers import ToyGPTDataset, ids_of


def _ds(**kw):
    args = {
        "seq_len": 6,
        "micro_batch_size": 2,
        "global_batch_size": 8,
        "data_parallel_rank": 0,
        "data_parallel_size": 2,
    }
    args.update(kw)
    return MegatronDataSampler(**args)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"seq_len": 0}, "seq_len"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"global_batch_size": 6}, "divisible"),
        ({"global_batch_size": 8, "micro_batch_size": 3}, "divisible"),
        ({"rampup_batch_size": [2, 2]}, "rampup_batch_size must be"),
        ({"rampup_batch_size": [2, 2, 10]}, "not divisible"),  # 2 % (2 * 2)
        ({"dataloader_type": "external"}, "dataloader_type must be one of"),
        ({"init_consumed_samples": -1}, "init_consumed_samples"),
        ({"init_global_step": -1}, "init_global_step"),
        ({"data_parallel_rank": None}, "give both"),
        ({"data_parallel_rank": 2}, "must be < data_parallel_size"),
        ({"global_shuffle": True}, "only applies to dataloader_type='cyclic'"),
        ({"global_shuffle": "yes", "dataloader_type": "cyclic"}, "global_shuffle must be a bool"),
        ({"pad_samples_to_global_batch_size": 1}, "must be a bool"),
        ({"data_sharding": False}, "only applies to dataloader_type='cyclic'"),
        ({"data_sharding": "no", "dataloader_type": "cyclic"}, "data_sharding must be a bool"),
        (
            {"data_sharding": False, "global_shuffle": True, "dataloader_type": "cyclic"},
            "choose one",
        ),
    ],
)
def test_config_errors(kwargs, needle):
    with pytest.raises(DataSamplerConfigError, match=needle):
        _ds(**kwargs)


def test_layout_defaults_to_single_process_without_distributed():
    ds = MegatronDataSampler(seq_len=4, micro_batch_size=2, global_batch_size=4)
    assert (ds.data_parallel_rank, ds.data_parallel_size) == (0, 1)
    assert ds.num_microbatches_at(0) == 2


def _collate(samples):
    return default_collate(samples)


def _init_worker(worker_id):
    torch.set_num_threads(1)


def test_transform_keeps_every_option_and_sets_the_sampler():
    loader = WrappedDataLoader(
        ToyGPTDataset(40),
        mode="train",
        num_workers=1,
        collate_fn=_collate,
        pin_memory=False,
        worker_init_fn=_init_worker,
        timeout=30,
        prefetch_factor=3,
        persistent_workers=True,
        batch_size=2,
        multiprocessing_context="fork",
    )
    out = _ds(init_consumed_samples=16).transform_dataloader(loader)
    assert isinstance(out, WrappedDataLoader) and out.mode == "train"
    assert out.collate_fn is _collate and out.worker_init_fn is _init_worker
    assert (out.num_workers, out.timeout, out.prefetch_factor, out.persistent_workers) == (
        1,
        30,
        3,
        True,
    )
    assert isinstance(out.batch_sampler, MegatronPretrainingSampler)
    assert out.batch_sampler.consumed_samples == 16 and out.consumed_samples == 16
    assert ids_of(next(iter(out))) == [16, 17]
    # transforming again (e.g. a subclass hook calling super()) rebuilds from the original options
    again = _ds().transform_dataloader(out)
    assert again.consumed_samples == 0 and again.prefetch_factor == 3


def test_transform_modes_types_and_drop_last():
    ds = _ds(init_consumed_samples=8)
    for mode in ("validation", "test", "predict"):
        out = ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(11), mode=mode))
        assert out.consumed_samples == 0  # only train loaders resume
        assert out.batch_sampler.drop_last is (mode == "validation")
    test = ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(11), mode="test"))
    assert [ids_of(b) for b in test] == [[0, 1], [4, 5], [8, 9]]  # rank 0 of 2, short tail kept
    explicit = ds.transform_dataloader(
        WrappedDataLoader(ToyGPTDataset(11), mode="test", drop_last=True)
    )
    assert explicit.batch_sampler.drop_last is True
    cyclic = _ds(dataloader_type="cyclic", global_shuffle=True, seed=3)
    assert isinstance(
        cyclic.transform_dataloader(
            WrappedDataLoader(ToyGPTDataset(16), mode="train")
        ).batch_sampler,
        MegatronPretrainingRandomSampler,
    )
    unsharded = _ds(dataloader_type="cyclic", data_sharding=False, seed=3).transform_dataloader(
        WrappedDataLoader(ToyGPTDataset(16), mode="train")
    )
    assert unsharded.batch_sampler.data_sharding is False
    # shuffling a test set is useless: test/predict use the in-order sampler
    assert isinstance(
        cyclic.transform_dataloader(
            WrappedDataLoader(ToyGPTDataset(16), mode="test")
        ).batch_sampler,
        MegatronPretrainingSampler,
    )
    batch = _ds(dataloader_type="batch")
    out = batch.transform_dataloader(
        WrappedDataLoader(ToyGPTDataset(16), mode="train", batch_size=8)
    )
    assert isinstance(out.batch_sampler, MegatronPretrainingBatchSampler)
    assert [ids_of(b) for b in out] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    padded = _ds(pad_samples_to_global_batch_size=True).transform_dataloader(
        WrappedDataLoader(ToyGPTDataset(11), mode="predict")
    )
    assert len(padded) == 4 and padded.batch_sampler.pad_samples_to_global_batch_size


def test_transform_refusals():
    ds = _ds()
    with pytest.raises(TypeError, match="WrappedDataLoader"):
        ds.transform_dataloader(DataLoader(ToyGPTDataset(8), batch_size=2))
    with pytest.raises(DataSamplerConfigError, match="batch_size=4"):
        ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(8), mode="train", batch_size=4))
    with pytest.raises(DataSamplerConfigError, match="shuffle=True"):
        ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(8), mode="train", shuffle=True))
    with pytest.raises(DataSamplerConfigError, match="sampler="):
        ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(8), mode="train", sampler=[0, 1]))
    with pytest.raises(TypeError, match="has no len"):
        ds.transform_dataloader(WrappedDataLoader(iter(range(8)), mode="train"))
    with pytest.raises(DataSamplerConfigError, match="only train loaders resume"):
        ds.transform_dataloader(
            WrappedDataLoader(ToyGPTDataset(8), mode="validation"), consumed_samples=4
        )
    with pytest.raises(SamplerConfigError, match="smaller than one global batch"):
        _ds(dataloader_type="cyclic", global_shuffle=True).transform_dataloader(
            WrappedDataLoader(ToyGPTDataset(6), mode="train")
        )


@pytest.mark.parametrize("rampup", [None, [4, 4, 24]])
def test_compute_consumed_samples_matches_what_the_loader_delivers(rampup):
    ds = _ds(rampup_batch_size=rampup, data_parallel_size=1, data_parallel_rank=0)
    loader = ds.transform_dataloader(WrappedDataLoader(ToyGPTDataset(400), mode="train"))
    it = iter(loader)
    for step in range(1, 12):
        for _ in range(ds.num_microbatches_at(loader.consumed_samples)):
            next(it)
        assert ds.compute_consumed_samples(step) == loader.consumed_samples, step
    if rampup is not None:  # 6 steps of 4 (int(c / 24) == 0 for c < 24), then 8 from c = 24
        assert [ds.global_batch_size_at(c) for c in (0, 20, 24)] == [4, 4, 8]
        assert ds.compute_consumed_samples(6) == 24 and ds.compute_consumed_samples(7) == 32
    # resuming at a recorded position continues the same schedule
    resumed = _ds(
        rampup_batch_size=rampup,
        data_parallel_size=1,
        data_parallel_rank=0,
        init_consumed_samples=ds.compute_consumed_samples(5),
        init_global_step=5,
    )
    assert resumed.compute_consumed_samples(6) == ds.compute_consumed_samples(11)
    with pytest.raises(DataSamplerConfigError, match="steps_since_resume"):
        ds.compute_consumed_samples(-1)
