"""Unit tests of the GPT dataset builder, blends and split strings."""

import math

import numpy as np
import pytest

from epochal.data.datasets.blended_dataset import BlendedDataset
from epochal.data.datasets.dataset_builder import GPTDatasetConfig, build_gpt_datasets, parse_blend
from epochal.data.datasets.gpt_dataset import GPTDataset
from epochal.data.datasets.splits import parse_split, split_document_ranges, split_matrix
from tests.data.gpt_corpus import EOD, random_documents, write_ours


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("builder"))
    return {
        "a": write_ours(root, "a", random_documents(21, 80, max_length=40)),
        "b": write_ours(root, "b", random_documents(22, 50, max_length=60)),
    }


def test_single_prefix_splits_use_disjoint_document_ranges(prefixes):
    config = GPTDatasetConfig(seq_length=16, seed=3, data_path=[prefixes["a"]], split="8,1,1")
    train, valid, test = build_gpt_datasets(config, [100, None, 5])
    assert [type(d) for d in (train, valid, test)] == [GPTDataset] * 3
    assert len(train) >= 100 and len(test) >= 5
    assert (train.documents.min(), train.documents.max()) == (0, 63)
    assert (valid.documents.min(), valid.documents.max()) == (64, 71)
    assert (test.documents.min(), test.documents.max()) == (72, 79)
    assert valid.num_epochs == 1 and valid.split == "valid"


def test_weighted_blend_sizes_follow_megatron(prefixes):
    config = GPTDatasetConfig(
        seq_length=8,
        seed=1,
        data_path=["0.25", prefixes["a"], "0.75", prefixes["b"]],
        split="9,1,0",
    )
    train, valid, test = build_gpt_datasets(config, [101, 10, 0])
    assert test is None
    assert isinstance(train, BlendedDataset)
    assert len(train) == math.ceil(101 * 0.25) + math.ceil(101 * 0.75)
    assert [
        len(d) >= math.ceil(math.ceil(101 * w) * 1.005)
        for d, w in zip(train.datasets, (0.25, 0.75))
    ] == [True] * 2
    assert np.bincount(train.dataset_index).tolist() == [26, 76]
    assert train[0]["tokens"].shape == (8,) and "dataset_id" in train[0]


def test_unweighted_blend_and_per_split_paths(prefixes):
    config = GPTDatasetConfig(
        seq_length=8, seed=1, data_path=[prefixes["a"], prefixes["b"]], split="1"
    )
    train, valid, test = build_gpt_datasets(config, [50, None, None])
    assert valid is None and test is None and len(train) == 50
    config = GPTDatasetConfig(
        seq_length=8,
        seed=1,
        train_data_path=[prefixes["a"]],
        valid_data_path=["2", prefixes["a"], "1", prefixes["b"]],
    )
    train, valid, test = build_gpt_datasets(config, [20, 30, 10])
    assert isinstance(train, GPTDataset) and train.documents.size == 80
    assert isinstance(valid, BlendedDataset) and test is None


def test_mock_builds_without_files():
    config = GPTDatasetConfig(seq_length=32, seed=0, vocab_size=500, eod_token_id=EOD)
    assert config.mock
    train, valid, test = build_gpt_datasets(config, [10, 10, 10])
    sample = train[0]
    assert sample["tokens"].shape == (32,) and int(sample["tokens"].max()) < 500
    assert [len(d.documents) for d in (train, valid, test)] == [33333, 33334, 33333]


def test_empty_split_raises_instead_of_hanging(prefixes):
    # 80 documents: the test split of "969,30,1" is round(0.999 * 80) .. 80, empty (Megatron hangs)
    config = GPTDatasetConfig(seq_length=16, seed=3, data_path=[prefixes["a"]], split="969,30,1")
    with pytest.raises(ValueError, match=r"test split .* empty: 0 of its 80 documents"):
        build_gpt_datasets(config, [100, 10, 1])


def test_empty_split_with_no_samples_requested_is_absent(prefixes):
    config = GPTDatasetConfig(seq_length=16, seed=3, data_path=[prefixes["a"]], split="969,30,1")
    train, valid, test = build_gpt_datasets(config, [100, 10, 0])
    assert test is None and isinstance(valid, GPTDataset)
    blend = ["1", prefixes["a"], "1", prefixes["b"]]
    config = GPTDatasetConfig(seq_length=16, seed=3, data_path=blend, split="969,30,1")
    train, valid, test = build_gpt_datasets(config, [100, 10, 0])
    assert test is None and isinstance(train, BlendedDataset)
    with pytest.raises(ValueError, match="test split"):
        build_gpt_datasets(config, [100, 10, 3])


def test_missing_prefix_names_the_file(tmp_path):
    config = GPTDatasetConfig(seq_length=8, seed=0, data_path=[str(tmp_path / "nope")], split="1")
    with pytest.raises(FileNotFoundError, match="nope"):
        build_gpt_datasets(config, [1, 1, 1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"seq_length": 0}, "seq_length"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"mid_level_dataset_surplus": -0.1}, "mid_level_dataset_surplus"),
        ({"data_path": ["x"], "train_data_path": ["y"]}, "exclusive"),
        ({"data_path": ["x"], "mock": True}, "mock"),
        ({"data_path": ["x"], "split": "a,b"}, "split"),
        ({"data_path": ["x"], "split": "1,2,3,4"}, "split"),
        ({"data_path": ["x"], "split": "-1,2"}, "split"),
        ({"data_path": ["x"], "split": "0,0,0"}, "split"),
        ({"data_path": ["0.5", "x", "y", "z"]}, "alternate"),
        ({"data_path": ["-1", "x", "2", "z"]}, "weights"),
        ({"vocab_size": None, "eod_token_id": 0}, "vocab_size"),
        ({"eod_token_id": None}, "eod_token_id"),
    ],
)
def test_invalid_config(kwargs, match):
    args = {"seq_length": 8, "vocab_size": 100, "eod_token_id": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        GPTDatasetConfig(**args)


@pytest.mark.parametrize(
    "sizes, match", [([1, 2], "train, valid, test"), ([1, -1, 1], "valid"), ([1, 1, 1.5], "test")]
)
def test_invalid_sizes(sizes, match):
    config = GPTDatasetConfig(seq_length=8, vocab_size=100, eod_token_id=0)
    with pytest.raises(ValueError, match=match):
        build_gpt_datasets(config, sizes)


def test_weighted_blend_needs_sizes(prefixes):
    config = GPTDatasetConfig(
        seq_length=8, data_path=["1", prefixes["a"], "1", prefixes["b"]], split="1,1"
    )
    with pytest.raises(ValueError, match="valid split"):
        build_gpt_datasets(config, [10, None, None])


def test_parse_blend_forms():
    assert parse_blend(None) is None and parse_blend([]) is None
    assert parse_blend(["p"]) == (["p"], None)
    assert parse_blend("0.3 a 0.7 b") == (["a", "b"], [0.3, 0.7])
    assert parse_blend(["a", "b"]) == (["a", "b"], None)
    assert parse_blend(["a", "b", "c"]) == (["a", "b", "c"], None)


def test_split_strings():
    assert parse_split("99,1") == [0.99, 0.01, 0.0]
    assert parse_split("1/1/2") == [0.25, 0.25, 0.5]
    assert split_matrix([0.99, 0.01, 0.0])[2] is None
    assert split_document_ranges("969,30,1", 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert split_document_ranges("1,1,1", 10) == [(0, 3), (3, 7), (7, 10)]
    assert split_document_ranges("1,0,1", 10) == [(0, 5), None, (5, 10)]
    with pytest.raises(ValueError):
        split_document_ranges("1", -1)
