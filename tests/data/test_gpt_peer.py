"""Peer tests: every sample equals Megatron-Core's GPTDataset / BlendedDataset / builder.

Megatron-Core writes the files (its IndexedDatasetBuilder) and reads them with its own
IndexedDataset; epochal reads the same files with epochal's IndexedDataset.
Megatron's BlendedDataset calls torch.distributed.get_rank() when a cache path is
set, so the module runs inside a single-process gloo group.
"""

import itertools
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from epochal.data.datasets.blended_dataset import (
    BlendedDataset,
    build_blending_indices,
    build_exhaustive_blending_indices,
)
from epochal.data.datasets.dataset_builder import GPTDatasetConfig, build_gpt_datasets
from epochal.data.datasets.gpt_dataset import GPTDataset
from epochal.data.datasets.gpt_indices import plan_epochs
from epochal.data.indexed.indexed_dataset import IndexedDataset
from tests.data.gpt_corpus import EOD, VOCAB, random_documents, write_megatron

# Megatron-Core hangs forever on an empty split: never wait long for it.
pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

megatron = pytest.importorskip("megatron.core.datasets.gpt_dataset")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers as mhelpers
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset as MGPTDataset
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig as MConfig
    from megatron.core.datasets.gpt_dataset import MockGPTDataset as MMockGPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset
    from megatron.core.datasets.utils import Split


class DuckTokenizer:
    """The parts of a Megatron tokenizer that the GPT datasets read."""

    vocab_size = VOCAB
    eod = EOD
    unique_identifiers = {"class": "DuckTokenizer", "vocab_size": VOCAB}


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory):
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "filestore"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("gpt_peer"))
    return {
        "a": write_megatron(root, "a", random_documents(1, 80, max_length=40)),
        "b": write_megatron(root, "b", random_documents(2, 50, max_length=70)),
        "c": write_megatron(root, "c", random_documents(3, 30, max_length=25)),
    }


def megatron_config(cache, **kw):
    options = dict(
        random_seed=kw.pop("seed", 1234),
        sequence_length=kw.pop("seq", 16),
        tokenizer=DuckTokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=True,
        path_to_cache=cache,
    )
    options.update(kw)
    return MConfig(**options)


def assert_same_samples(ours, theirs, check_indices=True):
    assert len(ours) == len(theirs)
    if check_indices:
        np.testing.assert_array_equal(ours.document_index, theirs.document_index)
        np.testing.assert_array_equal(ours.sample_index, theirs.sample_index)
        np.testing.assert_array_equal(ours.shuffle_index, theirs.shuffle_index)
        assert ours.sample_index.dtype == theirs.sample_index.dtype
        assert ours.shuffle_index.dtype == theirs.shuffle_index.dtype
    for i in range(len(theirs)):
        a, b = ours[i], theirs[i]
        assert set(a) == set(b), i
        for key in b:
            if key == "dataset_id":
                assert int(a[key]) == int(b[key]), i
                continue
            assert a[key].dtype == b[key].dtype, (i, key)
            assert torch.equal(a[key], b[key]), (i, key)


@pytest.mark.parametrize(
    "seq, num_samples, extra, split, drop",
    [
        (16, None, True, "train", True),  # one epoch
        (16, 50, True, "train", True),  # fewer than one epoch
        (16, 150, True, "train", True),  # two epochs, final epoch mostly used (not separate)
        (16, 120, True, "train", True),  # two epochs, final epoch separate (threshold 0.80)
        (7, 850, True, "test", True),  # many epochs, separate final epoch
        (7, 900, True, "test", True),  # many epochs, final epoch not separate
        (16, 120, False, "train", True),  # no extra token
        (16, None, True, "valid", False),  # kept partial last validation window
        (13, 333, False, "valid", False),
        (16, 0, True, "train", True),
    ],
)
def test_gpt_dataset_equals_megatron(corpora, tmp_path, seq, num_samples, extra, split, drop):
    prefix = corpora["a"]
    documents = np.arange(10, 70, dtype=np.int32)
    theirs = MGPTDataset(
        MIndexedDataset(prefix),
        prefix,
        documents,
        num_samples,
        Split[split],
        megatron_config(
            str(tmp_path / "m"),
            seq=seq,
            split="1,0,0",
            blend=([prefix], None),
            add_extra_token_to_sequence=extra,
            drop_last_partial_validation_sequence=drop,
        ),
    )
    ours = GPTDataset(
        IndexedDataset(prefix),
        documents,
        num_samples,
        seq,
        1234,
        split=split,
        add_extra_token_to_sequence=extra,
        drop_last_partial_sequence=drop,
        create_attention_mask=True,
        eod_token_id=EOD,
        cache_dir=tmp_path / "ours",
    )
    assert_same_samples(ours, theirs)


@pytest.mark.parametrize(
    "mode, validate, pad",
    [("mmap", True, None), ("cached", True, 5), ("lazy", True, None), ("mmap", False, None)],
)
def test_reads_equal_megatron_in_every_read_mode(corpora, tmp_path, mode, validate, pad):
    """Validated mmap/cached files take read_pieces' slice copies, the others checked gets."""
    prefix = corpora["b"]
    config = dict(create_attention_mask=False, drop_last_partial_validation_sequence=False)
    theirs = MGPTDataset(
        MIndexedDataset(prefix),
        prefix,
        np.arange(50, dtype=np.int32),
        None,
        Split.valid,
        megatron_config(
            str(tmp_path / "m"), seq=15, split="1,0,0", blend=([prefix], None), **config
        ),
    )
    if pad is not None:  # a real token id as the pad: Megatron masks those tokens too
        theirs._pad_token_id = pad
    ours = GPTDataset(
        IndexedDataset(prefix, mode=mode, validate=validate),
        None,
        None,
        15,
        1234,
        split="valid",
        drop_last_partial_sequence=False,
        pad_token_id=pad,
    )
    assert ours.dataset.validated is validate
    assert_same_samples(ours, theirs)
    last = int(np.flatnonzero(ours.shuffle_index == len(ours) - 1)[0])
    assert int(ours[last]["loss_mask"].sum()) < 15  # the padded last window


def test_peer_cases_cover_the_final_epoch_rule(corpora):
    indexed = MIndexedDataset(corpora["a"])  # keep it alive: its arrays are views of its mmap
    tokens = int(indexed.sequence_lengths[10:70].sum())
    assert (
        plan_epochs(tokens, 150, 16).num_epochs,
        plan_epochs(tokens, 150, 16).separate_final_epoch,
    ) == (2, False)
    assert (
        plan_epochs(tokens, 120, 16).num_epochs,
        plan_epochs(tokens, 120, 16).separate_final_epoch,
    ) == (2, True)
    assert plan_epochs(tokens, 850, 7).separate_final_epoch is True
    assert plan_epochs(tokens, 900, 7).separate_final_epoch is False
    assert plan_epochs(tokens, 900, 7).num_epochs > 3


@pytest.mark.parametrize(
    "reset_position_ids, reset_attention_mask, eod_mask_loss",
    list(itertools.product([False, True], repeat=3))[1:],
)
def test_eod_options_equal_megatron(
    corpora, tmp_path, reset_position_ids, reset_attention_mask, eod_mask_loss
):
    prefix = corpora["c"]
    flags = dict(
        reset_position_ids=reset_position_ids,
        reset_attention_mask=reset_attention_mask,
        eod_mask_loss=eod_mask_loss,
    )
    theirs = MGPTDataset(
        MIndexedDataset(prefix),
        prefix,
        np.arange(30, dtype=np.int32),
        60,
        Split.train,
        megatron_config(str(tmp_path), seq=24, split="1,0,0", blend=([prefix], None), **flags),
    )
    ours = GPTDataset(
        IndexedDataset(prefix),
        None,
        60,
        24,
        1234,
        create_attention_mask=True,
        eod_token_id=EOD,
        **flags,
    )
    assert_same_samples(ours, theirs)


def _megatron_build(sizes, **config):
    builder = BlendedMegatronDatasetBuilder(
        MGPTDataset, sizes, lambda: True, megatron_config(**config)
    )
    return builder.build()


BUILDER_CASES = {
    "single prefix": dict(data_path=["a"], split="90,7,3", sizes=[300, 40, 10]),
    "single prefix, one epoch each": dict(data_path=["a"], split="8,1,1", sizes=[None, None, None]),
    "single prefix, empty test split absent": dict(
        data_path=["b"], split="9,1", sizes=[100, 30, 5]
    ),
    "weighted blend": dict(data_path=["0.3", "a", "0.7", "b"], split="90,8,2", sizes=[400, 60, 10]),
    "weighted blend, three corpora": dict(
        data_path=["1", "a", "2", "b", "0.5", "c"], split="80,20,0", sizes=[500, 50, 0]
    ),
    "unweighted blend": dict(data_path=["a", "b", "c"], split="80,10,10", sizes=[200, 30, None]),
    "per-split blends": dict(
        train_data_path=["0.6", "a", "0.4", "b"],
        valid_data_path=["c"],
        test_data_path=["b", "c"],
        sizes=[250, 20, 15],
    ),
}


def test_constant_blend_schedule_equals_megatron(world_of_one, corpora, tmp_path):
    """A constant ``blend_schedule`` (two equal points) reads Megatron-Core's weighted blend."""
    from megatron.core.datasets.utils import get_blend_from_list

    from epochal.data.datasets.blend_schedule import BlendSchedule
    from epochal.data.datasets.scheduled_blend import ScheduledBlendedDataset

    paths = ["0.3", corpora["a"], "0.7", corpora["b"]]
    sizes = [400, 60, 10]
    blend = get_blend_from_list(paths)
    theirs = _megatron_build(
        sizes, cache=str(tmp_path / "m"), seq=12, seed=77, blend=blend, split="90,8,2"
    )
    config = GPTDatasetConfig(
        seq_length=12,
        seed=77,
        eod_token_id=EOD,
        create_attention_mask=True,
        path_to_cache=str(tmp_path / "ours"),
        data_path=paths,
        split="90,8,2",
        blend_schedule=BlendSchedule([(0, [0.3, 0.7]), (80, [3, 7])], "linear"),
        blend_schedule_weights=[0.3, 0.7],
    )
    ours = build_gpt_datasets(config, sizes)
    assert isinstance(ours[0], ScheduledBlendedDataset)
    for a, b in zip(ours, theirs):
        assert_same_samples(a, b, check_indices=False)
    counts = np.bincount(theirs[0].dataset_index, minlength=2).tolist()
    assert ours[0].source_counts(len(ours[0])) == counts


@pytest.mark.parametrize("case", list(BUILDER_CASES))
def test_builder_equals_megatron(world_of_one, corpora, tmp_path, case):
    spec = dict(BUILDER_CASES[case])
    sizes = spec.pop("sizes")

    def real(paths):
        return None if paths is None else [corpora.get(p, p) for p in paths]

    from megatron.core.datasets.utils import get_blend_from_list

    mkw = {"seq": 12, "seed": 77}
    if "data_path" in spec:
        mkw.update(blend=get_blend_from_list(real(spec["data_path"])), split=spec["split"])
    else:
        mkw["blend_per_split"] = [
            get_blend_from_list(real(spec.get(f"{s}_data_path")))
            for s in ("train", "valid", "test")
        ]
    theirs = _megatron_build(sizes, cache=str(tmp_path / "m"), **mkw)
    config = GPTDatasetConfig(
        seq_length=12,
        seed=77,
        eod_token_id=EOD,
        create_attention_mask=True,
        path_to_cache=str(tmp_path / "ours"),
        **{k: (real(v) if k.endswith("data_path") else v) for k, v in spec.items()},
    )
    ours = build_gpt_datasets(config, sizes)
    for split, a, b in zip(("train", "valid", "test"), ours, theirs):
        assert (a is None) == (b is None), split
        if b is not None:
            assert type(a).__name__ == type(b).__name__, split
            assert_same_samples(a, b, check_indices=False)
            if isinstance(a, BlendedDataset):
                np.testing.assert_array_equal(a.dataset_index, b.dataset_index)
                np.testing.assert_array_equal(a.dataset_sample_index, b.dataset_sample_index)


def test_mock_equals_megatron_mock(tmp_path):
    config = megatron_config(None, seq=64, seed=5)
    assert config.mock
    builder = BlendedMegatronDatasetBuilder(MMockGPTDataset, [200, 20, 20], lambda: True, config)
    theirs = builder.build()
    ours = build_gpt_datasets(
        GPTDatasetConfig(
            seq_length=64, seed=5, vocab_size=VOCAB, eod_token_id=EOD, create_attention_mask=True
        ),
        [200, 20, 20],
    )
    for a, b in zip(ours, theirs):
        assert len(a) == len(b)
        np.testing.assert_array_equal(a.shuffle_index, b.shuffle_index)
        for i in list(range(5)) + [len(b) - 1]:
            for key, value in b[i].items():
                assert torch.equal(a[i][key], value), key


@pytest.mark.parametrize("num_datasets", [2, 3, 7])
def test_blending_indices_equal_megatron_helpers(num_datasets):
    rng = np.random.default_rng(num_datasets)
    for trial in range(4):
        raw = rng.dirichlet(np.ones(num_datasets)) if trial else np.full(num_datasets, 1.0)
        weights = (np.asarray(raw, np.float64) / np.sum(raw)).tolist()
        size = 3000
        ref_ds = np.zeros(size, dtype=np.int16)
        ref_sample = np.zeros(size, dtype=np.int64)
        mhelpers.build_blending_indices(ref_ds, ref_sample, weights, num_datasets, size, False)
        ds, sample = build_blending_indices(weights, size)
        np.testing.assert_array_equal(ds, ref_ds)
        np.testing.assert_array_equal(sample, ref_sample)


@pytest.mark.parametrize(
    "weights",
    [
        [0.5, 0.5],
        [0.3, 0.7],
        [0.1, 0.9],
        [2, 1],
        [0.123456789, 0.7],
        [1, 1, 1],
        [0.3, 0.5, 0.2],
        [5, 1, 2, 0.5, 3],
        [1e-5, 0.3, 0.3, 0.4, 0.01, 0.02, 0.05, 0.1, 0.2, 0.9],
        [1, 1e-12],  # two datasets: the closed form, with near-ties on every step
        [0, 1],
        [0.6180339887, 1],
        [1e-12 if i % 4 == 0 else 1 + i % 7 for i in range(100)],  # a row of errors per chunk
    ],
)
def test_blend_equals_megatron_helpers_at_scale(weights):
    weights = (np.asarray(weights, np.float64) / np.sum(weights)).tolist()
    size = 1_500_000  # hundreds of chunks of the vectorized scan
    ref_ds = np.zeros(size, dtype=np.int16)
    ref_sample = np.zeros(size, dtype=np.int64)
    mhelpers.build_blending_indices(ref_ds, ref_sample, weights, len(weights), size, False)
    ds, sample = build_blending_indices(weights, size)
    np.testing.assert_array_equal(ds, ref_ds)
    np.testing.assert_array_equal(sample, ref_sample)


@pytest.mark.parametrize("num_datasets", [2, 100])
def test_blend_of_two_to_a_hundred_datasets_equals_megatron_helpers(num_datasets):
    """Random weights (and uniform ones) at every size around the closed form's blocks."""
    rng = np.random.default_rng(num_datasets)
    for trial in range(3):
        raw = rng.random(num_datasets) + 0.01 if trial else np.ones(num_datasets)
        weights = (raw / np.sum(raw)).tolist()
        sizes = (1, 2, 3, 1000, 32_768, 32_770, 200_000) if num_datasets == 2 else (1, 3, 200_000)
        for size in sizes:
            ref_ds = np.zeros(size, dtype=np.int16)
            ref_sample = np.zeros(size, dtype=np.int64)
            mhelpers.build_blending_indices(ref_ds, ref_sample, weights, num_datasets, size, False)
            ds, sample = build_blending_indices(weights, size)
            np.testing.assert_array_equal(ds, ref_ds)
            np.testing.assert_array_equal(sample, ref_sample)


def test_exhaustive_blending_indices_equal_megatron_helpers():
    for sizes in ([5, 9], [150_000, 77], [100, 1, 33], [7, 7, 7, 7], [400_000, 3, 77_777, 123_457]):
        total = sum(sizes)
        ref_ds = np.zeros(total, dtype=np.int16)
        ref_sample = np.zeros(total, dtype=np.int64)
        mhelpers.build_exhaustive_blending_indices(
            ref_ds, ref_sample, np.array(sizes, np.int64), len(sizes)
        )
        ds, sample = build_exhaustive_blending_indices(sizes)
        np.testing.assert_array_equal(ds, ref_ds)
        np.testing.assert_array_equal(sample, ref_sample)


def test_megatron_reuses_a_wrong_cache_and_we_do_not(corpora, tmp_path):
    """Megatron's cache key omits add_extra_token_to_sequence; ours hashes every option."""
    prefix = corpora["a"]
    documents = np.arange(80, dtype=np.int32)

    def theirs(extra, cache):
        config = megatron_config(
            str(cache), split="1,0,0", blend=([prefix], None), add_extra_token_to_sequence=extra
        )
        return MGPTDataset(MIndexedDataset(prefix), prefix, documents, 40, Split.train, config)

    shared = tmp_path / "megatron-shared"
    stale = (theirs(True, shared), theirs(False, shared))[1]
    fresh = theirs(False, tmp_path / "megatron-fresh")
    assert not np.array_equal(stale.sample_index, fresh.sample_index)  # Megatron: stale cache
    ours = [
        GPTDataset(
            IndexedDataset(prefix),
            documents,
            40,
            16,
            1234,
            add_extra_token_to_sequence=e,
            cache_dir=tmp_path / "ours",
        )
        for e in (True, False)
    ]
    assert ours[0].cache_info["hash"] != ours[1].cache_info["hash"]
    np.testing.assert_array_equal(ours[1].sample_index, fresh.sample_index)


def test_split_ranges_equal_megatron():
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    from epochal.data.datasets.splits import split_document_ranges

    for split in (
        "969,30,1",
        "99,1",
        "1,1,1",
        "8,1,1",
        "90,8,2",
        "1",
        "0.7,0.2,0.1",
        "3,0,7",
        "949,50,1",
    ):
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
        for n in (0, 1, 7, 10, 80, 999, 1000, 123457):
            theirs = [
                None if m is None else (int(round(m[0] * float(n))), int(round(m[1] * float(n))))
                for m in matrix
            ]
            assert split_document_ranges(split, n) == theirs, (split, n)
