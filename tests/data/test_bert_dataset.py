"""BERTDataset / build_bert_datasets: options, errors, caching and determinism (no Megatron)."""

import pickle

import numpy as np
import pytest

from epochal.data import BERTDataset, BERTDatasetConfig, EpochIndex, build_bert_datasets
from epochal.data.datasets.bert_indices import MT19937_64
from epochal.testing import (
    assert_dataset_compatible_with_megatron,
    assert_dataset_deterministic_across_processes,
    assert_dataset_elements_not_equal,
)
from tests.data.bert_corpus import (
    BertVocabTokenizer,
    random_sentence_documents,
    write_sentence_corpus,
    write_vocab,
)

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("bert"))
    tokenizer = BertVocabTokenizer(write_vocab(directory))
    prefix = write_sentence_corpus(
        directory, "corpus", random_sentence_documents(3, 50), megatron=False
    )
    one_sentence = write_sentence_corpus(
        directory, "unsplit", random_sentence_documents(4, 20, max_sentences=1), megatron=False
    )
    return directory, tokenizer, prefix, one_sentence


def test_mt19937_64_matches_the_cpp_standard():
    # [rand.predef]: the 10000th output of a default-constructed std::mt19937_64
    assert int(MT19937_64(5489).draw(10000)[-1]) == 9981545732273789042


def test_samples_have_megatron_keys_and_types(setup):
    _, tokenizer, prefix, _ = setup
    config = BERTDatasetConfig(seq_length=40, tokenizer=tokenizer, data_path=[prefix], split="1")
    train, valid, test = build_bert_datasets(config, [64, 0, 0])
    assert valid is None and test is None and isinstance(train, BERTDataset)
    assert len(train) >= 64
    for i in range(len(train)):
        sample = train[i]
        assert list(sample) == [
            "text", "types", "labels", "is_random", "padding_mask", "loss_mask", "truncated"
        ]  # fmt: skip
        for key in ("text", "types", "labels", "padding_mask", "loss_mask"):
            assert sample[key].dtype == np.int64 and sample[key].shape == (40,)
        assert sample["is_random"] in (0, 1) and sample["truncated"] in (0, 1)
        # (a random replacement may itself be [PAD]: Megatron then marks it as padding)
        text, last = sample["text"], int(np.flatnonzero(sample["padding_mask"])[-1])
        assert text[0] == tokenizer.cls and text[last] == tokenizer.sep
        masked = sample["loss_mask"] == 1
        assert masked.any() and (sample["labels"][~masked] == -1).all()
        assert (
            sample["labels"][masked] >= len(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        ).all()
    assert {train[i]["is_random"] for i in range(len(train))} == {0, 1}


def test_one_segment_without_classification_head(setup):
    _, tokenizer, prefix, _ = setup
    config = BERTDatasetConfig(
        seq_length=40,
        tokenizer=tokenizer,
        data_path=[prefix],
        split="8,1,1",
        classification_head=False,
    )
    train = build_bert_datasets(config, [30, 5, 5])[0]
    for i in range(len(train)):
        sample = train[i]
        assert sample["is_random"] == 0 and (sample["types"] == 0).all()


def test_not_sentence_split_corpus_needs_no_classification_head(setup):
    _, tokenizer, _, one_sentence = setup
    config = BERTDatasetConfig(
        seq_length=40, tokenizer=tokenizer, data_path=[one_sentence], split="8,1,1"
    )
    with pytest.raises(ValueError, match="classification_head") as err:
        build_bert_datasets(config, [10, 2, 2])
    assert one_sentence in str(err.value) and "--split-sentences" in str(err.value)
    config.classification_head = False
    assert len(build_bert_datasets(config, [10, 2, 2])[0]) >= 10


class NoMaskTokenizer:
    cls, sep, pad = 2, 3, 0
    inv_vocab = {0: "[PAD]", 2: "[CLS]", 3: "[SEP]"}

    @property
    def mask(self):
        raise NotImplementedError("no [MASK]")


class NoClsSepTokenizer:
    mask, pad = 4, 0
    cls = sep = None
    inv_vocab = {0: "[PAD]", 4: "[MASK]"}


def test_tokenizer_without_mask_cls_or_sep_is_rejected(setup):
    with pytest.raises(ValueError, match=r"tokenizer: NoMaskTokenizer has no mask"):
        BERTDatasetConfig(seq_length=40, tokenizer=NoMaskTokenizer(), data_path=["x"])
    with pytest.raises(ValueError, match=r"tokenizer: NoClsSepTokenizer has no cls, sep"):
        BERTDatasetConfig(seq_length=40, tokenizer=NoClsSepTokenizer(), data_path=["x"])


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("seq_length", 4),
        ("seed", -1),
        ("seed", 2**31),
        ("masking_probability", 0.0),
        ("masking_probability", 1.0),
        ("short_sequence_probability", 1.5),
        ("masking_max_ngram", 0),
        ("masking_do_full_word", 1),
        ("classification_head", None),
        ("mid_level_dataset_surplus", -0.1),
        ("split", "1,x"),
    ],
)
def test_invalid_options_are_named(setup, option, value):
    _, tokenizer, prefix, _ = setup
    kwargs = {"seq_length": 40, "tokenizer": tokenizer, "data_path": [prefix], option: value}
    with pytest.raises(ValueError, match=option):
        BERTDatasetConfig(**kwargs)


def test_exclusive_and_missing_options(setup):
    _, tokenizer, prefix, _ = setup
    with pytest.raises(ValueError, match="masking_do_permutation"):
        BERTDatasetConfig(
            seq_length=40,
            tokenizer=tokenizer,
            data_path=[prefix],
            masking_do_permutation=True,
            masking_use_geometric_distribution=True,
        )
    with pytest.raises(ValueError, match="data_path"):
        BERTDatasetConfig(seq_length=40, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        BERTDatasetConfig(seq_length=40, tokenizer=None, data_path=[prefix])


@pytest.mark.parametrize("permutation", [False, True])
def test_samples_are_a_pure_function_of_seed_and_index(setup, permutation):
    _, tokenizer, prefix, _ = setup
    config = BERTDatasetConfig(
        seq_length=40,
        tokenizer=tokenizer,
        data_path=[prefix],
        split="1",
        masking_do_permutation=permutation,
    )
    train = build_bert_datasets(config, [40, 0, 0])[0]
    for index in (0, 7, EpochIndex(3, 11)):
        assert_dataset_compatible_with_megatron(train, index)
    assert_dataset_elements_not_equal(train, 0, 1)
    assert_dataset_deterministic_across_processes(train, [0, 5, 39])
    again = build_bert_datasets(config, [40, 0, 0])[0]
    other_seed = BERTDatasetConfig(
        seq_length=40, tokenizer=tokenizer, data_path=[prefix], split="1", seed=99
    )
    reseeded = build_bert_datasets(other_seed, [40, 0, 0])[0]
    assert all(np.array_equal(train[i]["text"], again[i]["text"]) for i in range(40))
    assert any(not np.array_equal(train[i]["text"], reseeded[i]["text"]) for i in range(40))


def test_index_cache_is_reused_and_pickles_as_a_file(setup, tmp_path):
    _, tokenizer, prefix, _ = setup
    config = BERTDatasetConfig(
        seq_length=40,
        tokenizer=tokenizer,
        data_path=[prefix],
        split="8,1,1",
        path_to_cache=str(tmp_path),
    )
    first = build_bert_datasets(config, [50, 5, 5])
    second = build_bert_datasets(config, [50, 5, 5])
    in_memory = build_bert_datasets(
        BERTDatasetConfig(seq_length=40, tokenizer=tokenizer, data_path=[prefix], split="8,1,1"),
        [50, 5, 5],
    )
    assert not first[0].cache_info["cache_hit"] and second[0].cache_info["cache_hit"]
    copy = pickle.loads(pickle.dumps(second[0]))
    assert isinstance(copy.sample_index, np.memmap)
    for a, b, c in zip(first, second, in_memory):
        np.testing.assert_array_equal(a.sample_index, c.sample_index)
        for i in range(len(a)):
            for key in ("text", "labels", "types"):
                np.testing.assert_array_equal(a[i][key], b[i][key])
    for i in range(len(copy)):
        np.testing.assert_array_equal(copy[i]["text"], second[0][i]["text"])


def test_splits_cut_documents_not_sentences(setup):
    _, tokenizer, prefix, _ = setup
    config = BERTDatasetConfig(
        seq_length=40, tokenizer=tokenizer, data_path=[prefix], split="6,2,2"
    )
    train, valid, test = build_bert_datasets(config, [None, None, None])
    bounds = train.dataset.document_indices
    # 50 documents split 30/10/10: each split's samples stay inside its documents' sentences
    for dataset, (lo, hi) in zip((train, valid, test), ((0, 30), (30, 40), (40, 50))):
        rows = np.asarray(dataset.sample_index)
        assert rows[:, 0].min() >= bounds[lo] and rows[:, 1].max() <= bounds[hi]
