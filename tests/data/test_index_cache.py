"""Tests of the hash-named .npy index cache: hits, misses, concurrency, corruption, ranks."""

import json
import multiprocessing
import os
import time
import warnings

import numpy as np
import pytest

from epochal.data.datasets.dataset_builder import GPTDatasetConfig, build_gpt_datasets
from epochal.data.datasets.gpt_dataset import GPTDataset
from epochal.data.datasets.index_cache import CacheRebuildWarning, cached_arrays, describe
from tests.data.gpt_corpus import ArrayCorpus, random_documents
from tests.dist_utils import run_gloo

NAMES = ("a", "b")


def arrays_for(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"a": rng.integers(0, 100, size=1000).astype(np.int32), "b": rng.random((50, 2))}


class Counter:
    def __init__(self, seed=0, delay=0.0):
        self.calls = 0
        self.seed = seed
        self.delay = delay

    def __call__(self):
        self.calls += 1
        time.sleep(self.delay)
        return arrays_for(self.seed)


def test_hit_after_miss_and_files(tmp_path):
    build = Counter()
    first, info = cached_arrays(
        tmp_path, "Kind", "train", {"x": 1, "arr": np.arange(5)}, NAMES, build
    )
    assert build.calls == 1 and info["cache_hit"] is False
    again, info2 = cached_arrays(
        tmp_path, "Kind", "train", {"x": 1, "arr": np.arange(5)}, NAMES, build
    )
    assert build.calls == 1 and info2["cache_hit"] is True
    assert isinstance(again["a"], np.memmap) and not again["a"].flags.writeable
    for name in NAMES:
        np.testing.assert_array_equal(first[name], again[name])
        assert os.path.basename(info["paths"][name]) == f"{info['hash']}-Kind-train-{name}.npy"
    description = json.loads((tmp_path / f"{info['stem']}-description.json").read_text())
    assert description["identity"]["x"] == 1 and description["arrays"]["b"]["shape"] == [50, 2]
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_any_identity_change_misses(tmp_path):
    base = {"seed": 1, "lengths": np.arange(10, dtype=np.int32), "flag": True}
    keys = {describe(base)[1]}
    for change in ({"seed": 2}, {"lengths": np.arange(1, 11, dtype=np.int32)}, {"flag": False}):
        keys.add(describe({**base, **change})[1])
    keys.add(describe({**base, "lengths": np.arange(10, dtype=np.int64)})[1])  # dtype counts
    assert len(keys) == 5
    build = Counter()
    cached_arrays(tmp_path, "K", "train", base, NAMES, build)
    cached_arrays(tmp_path, "K", "valid", base, NAMES, build)  # the split names the files too
    cached_arrays(tmp_path, "K", "train", {**base, "seed": 2}, NAMES, build)
    assert build.calls == 3


def test_gpt_dataset_cache_hit_and_miss(tmp_path):
    corpus = ArrayCorpus(random_documents(4, 30))
    a = GPTDataset(corpus, None, 50, 8, seed=1, cache_dir=tmp_path)
    b = GPTDataset(corpus, None, 50, 8, seed=1, cache_dir=tmp_path)
    assert not a.cache_info["cache_hit"] and b.cache_info["cache_hit"]
    np.testing.assert_array_equal(a.shuffle_index, b.shuffle_index)
    for changed in (
        dict(seed=2),
        dict(num_samples=51),
        dict(seq_length=9),
        dict(add_extra_token_to_sequence=False),
        dict(drop_last_partial_sequence=False),
        dict(document_ids=np.arange(1, 30)),
    ):
        args = dict(document_ids=None, num_samples=50, seq_length=8, seed=1) | changed
        assert not GPTDataset(corpus, cache_dir=tmp_path, **args).cache_info["cache_hit"], changed
    # same path, different document lengths: never the stale cache
    other = ArrayCorpus(random_documents(5, 30))
    c = GPTDataset(other, None, 50, 8, seed=1, cache_dir=tmp_path)
    assert not c.cache_info["cache_hit"]


@pytest.mark.parametrize(
    "damage", ["truncate", "garbage", "extra bytes", "description", "wrong shape"]
)
def test_corrupted_cache_is_rebuilt_with_a_warning(tmp_path, damage):
    build = Counter()
    good, info = cached_arrays(tmp_path, "K", "train", {"v": 1}, NAMES, build)
    good = {k: np.array(v) for k, v in good.items()}
    path = info["paths"]["a"]
    description = tmp_path / f"{info['stem']}-description.json"
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 100)
    elif damage == "garbage":
        with open(path, "wb") as f:
            f.write(b"\x00garbage" * 20)
    elif damage == "extra bytes":
        with open(path, "ab") as f:
            f.write(b"\x00" * 8)
    elif damage == "description":
        description.write_text("{ not json")
    else:
        np.save(path, np.zeros(3, dtype=np.int32))
    with pytest.warns(CacheRebuildWarning, match="rebuilding"):
        rebuilt, info2 = cached_arrays(tmp_path, "K", "train", {"v": 1}, NAMES, build)
    assert build.calls == 2 and info2["cache_hit"] is False
    for name in NAMES:
        np.testing.assert_array_equal(rebuilt[name], good[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info3 = cached_arrays(tmp_path, "K", "train", {"v": 1}, NAMES, build)
    assert info3["cache_hit"] is True


def _concurrent_builder(directory, barrier, queue):
    barrier.wait()
    try:
        arrays, info = cached_arrays(
            directory, "K", "train", {"v": 7}, NAMES, Counter(seed=7, delay=0.2)
        )
        queue.put((True, int(np.asarray(arrays["a"]).sum())))
    except BaseException as err:  # noqa: BLE001 - report to the parent
        queue.put((False, repr(err)))


def test_concurrent_builders_never_expose_a_partial_cache(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(4)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_concurrent_builder, args=(str(tmp_path), barrier, queue))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    expected = int(arrays_for(7)["a"].sum())
    assert all(ok for ok, _ in results), results
    assert [value for _, value in results] == [expected] * 4
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    _, info = cached_arrays(tmp_path, "K", "train", {"v": 7}, NAMES, Counter(seed=7))
    assert info["cache_hit"]


def _ranked_build(rank, world_size, directory):
    out = []
    for shared in (True, False):
        cache_dir = os.path.join(directory, "shared" if shared else f"rank{rank}")
        build = Counter(seed=3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            arrays, info = cached_arrays(cache_dir, "K", "train", {"v": 3}, NAMES, build)
        out.append(
            (
                build.calls,
                info["cache_hit"],
                int(np.asarray(arrays["a"]).sum()),
                [str(w.message) for w in caught],
            )
        )
    # a GPTDataset built through the shared cache gives every rank the same samples
    corpus = ArrayCorpus(random_documents(9, 25))
    ds = GPTDataset(corpus, None, 40, 8, seed=6, cache_dir=os.path.join(directory, "gpt"))
    samples = [ds[i]["tokens"].tolist() for i in range(len(ds))]
    out.append((ds.cache_info["cache_hit"], samples))
    # the builder: a weighted blend, built on rank 0 first, identical on every rank
    corpora = {"x": ArrayCorpus(random_documents(1, 40)), "y": ArrayCorpus(random_documents(2, 30))}
    config = GPTDatasetConfig(
        seq_length=8,
        seed=2,
        data_path=["0.4", "x", "0.6", "y"],
        split="8,2,0",
        path_to_cache=os.path.join(directory, "builder"),
    )
    train, valid, _ = build_gpt_datasets(config, [60, 10, 0], open_indexed=corpora.__getitem__)
    out.append(
        (
            train.cache_info["cache_hit"],
            [train[i]["tokens"].tolist() + [train[i]["dataset_id"]] for i in range(len(train))],
            [valid[i]["tokens"].tolist() for i in range(len(valid))],
        )
    )
    return out


@pytest.mark.distributed
def test_rank_zero_builds_and_other_ranks_load(tmp_path):
    (shared0, local0, gpt0, built0), (shared1, local1, gpt1, built1) = run_gloo(
        _ranked_build, 2, str(tmp_path)
    )
    assert built0[0] is False and built1[0] is True and built0[1:] == built1[1:]
    assert len(built0[1]) >= 60 and {row[-1] for row in built0[1]} == {0, 1}
    assert gpt0[0] is False and gpt1[0] is True and gpt0[1] == gpt1[1]
    assert gpt0[1] == [
        GPTDataset(ArrayCorpus(random_documents(9, 25)), None, 40, 8, seed=6)[i]["tokens"].tolist()
        for i in range(len(gpt0[1]))
    ]
    expected = int(arrays_for(3)["a"].sum())
    assert shared0[:3] == (1, False, expected)
    assert shared1[:3] == (0, True, expected) and shared1[3] == []
    # without a shared file system every rank ends up with its own valid copy
    assert local0[:3] == (1, False, expected)
    assert local1[:3] == (1, False, expected)
    assert any("not a shared file system" in m for m in local1[3])


def test_no_cache_dir_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build = Counter()
    arrays, info = cached_arrays(None, "K", "train", {"v": 1}, NAMES, build)
    assert build.calls == 1 and info["paths"] == {} and os.listdir(tmp_path) == []
    assert isinstance(arrays["a"], np.ndarray)


def test_builder_must_return_the_declared_names(tmp_path):
    with pytest.raises(ValueError, match="expected"):
        cached_arrays(tmp_path, "K", "train", {"v": 1}, ("a", "c"), Counter())


def test_unsupported_identity_value():
    with pytest.raises(TypeError, match="cannot describe"):
        describe({"x": object()})


def test_cached_datasets_pickle_as_file_names(tmp_path):
    import pickle

    from epochal.data.datasets.blended_dataset import BlendedDataset

    corpus = ArrayCorpus(random_documents(8, 200, max_length=60))
    ds = GPTDataset(corpus, None, 20_000, 8, seed=3, cache_dir=tmp_path)
    assert isinstance(ds.shuffle_index, np.memmap)  # the builder serves the saved files too
    indices_bytes = ds.shuffle_index.nbytes + ds.sample_index.nbytes + ds.document_index.nbytes
    blob = pickle.dumps(ds)
    assert len(blob) < indices_bytes / 4
    copy = pickle.loads(blob)
    assert isinstance(copy.sample_index, np.memmap)
    for i in (0, 7, len(ds) - 1):
        assert copy[i]["tokens"].tolist() == ds[i]["tokens"].tolist()
    blend = BlendedDataset([ds, ds], [1, 1], 30_000, cache_dir=tmp_path)
    again = pickle.loads(pickle.dumps(blend))
    np.testing.assert_array_equal(again.dataset_sample_index, blend.dataset_sample_index)
    in_memory = GPTDataset(corpus, None, 20_000, 8, seed=3)
    assert len(pickle.dumps(in_memory)) > indices_bytes
