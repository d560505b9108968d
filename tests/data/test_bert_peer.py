"""Peer tests: every BERT sample equals Megatron-Core 0.16.1's BERTMaskedWordPieceDataset.

Megatron-Core writes a sentence-split corpus (its IndexedDatasetBuilder) and reads it with
its IndexedDataset; epochal reads the same files with its own. Megatron's masked datasets
call torch.distributed.get_rank() unguarded, so the module runs in a one-process gloo group.
Megatron draws the permutation N-gram sizes from numpy's global generator; the test seeds
it as epochal seeds its own per-sample generator (see epochal.data.datasets.bert_dataset).
"""

import warnings

import numpy as np
import pytest

from epochal.data.datasets.bert_builder import BERTDatasetConfig, build_bert_datasets
from epochal.data.datasets.bert_dataset import PERMUTATION_SEED_WORD, BERTDataset
from epochal.data.datasets.bert_indices import build_bert_sample_index
from epochal.data.indexed.indexed_dataset import IndexedDataset
from tests.data.bert_corpus import (
    BertVocabTokenizer,
    random_sentence_documents,
    write_sentence_corpus,
    write_vocab,
)

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300)]

pytest.importorskip("megatron.core.datasets.bert_dataset")
pytest.importorskip("transformers")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets import helpers as mhelpers
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset as MBERTDataset
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDatasetConfig as MConfig
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset
    from megatron.core.datasets.utils import Split

SEQ = 48
MASKING_FIELDS = (
    "masking_probability",
    "short_sequence_probability",
    "masking_max_ngram",
    "masking_do_full_word",
    "masking_do_permutation",
    "masking_use_longer_ngrams",
    "masking_use_geometric_distribution",
    "classification_head",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, world_of_one):
    directory = str(tmp_path_factory.mktemp("bert"))
    tokenizer = BertVocabTokenizer(write_vocab(directory))
    prefix = write_sentence_corpus(directory, "a", random_sentence_documents(0, 60))
    other = write_sentence_corpus(directory, "b", random_sentence_documents(1, 40, max_words=25))
    return directory, tokenizer, prefix, other


def megatron_config(config: BERTDatasetConfig, cache: str, **kwargs) -> MConfig:
    return MConfig(
        random_seed=config.seed,
        sequence_length=config.seq_length,
        tokenizer=config.tokenizer,
        path_to_cache=cache,
        **{name: getattr(config, name) for name in MASKING_FIELDS},
        **kwargs,
    )


def megatron_sample(dataset, config: BERTDatasetConfig, index: int) -> dict:
    np.random.seed([config.seed, index, PERMUTATION_SEED_WORD])  # noqa: NPY002 - Megatron reads it
    return dataset[index]


def assert_same_samples(ours, theirs, config: BERTDatasetConfig) -> None:
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        expected, actual = megatron_sample(theirs, config, i), ours[i]
        assert list(actual) == list(expected)
        for key, value in expected.items():
            if isinstance(value, np.ndarray):
                assert actual[key].dtype == value.dtype, (i, key)
                np.testing.assert_array_equal(actual[key], value, err_msg=f"sample {i} {key}")
            else:
                assert type(actual[key]) is type(value) and actual[key] == value, (i, key)


@pytest.mark.parametrize("trial", range(12))
def test_sample_index_equals_build_mapping(trial):
    rng = np.random.default_rng(100 + trial)
    counts = rng.integers(0, 8, size=int(rng.integers(1, 80)))
    bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    sizes = rng.integers(0, 60, size=int(bounds[-1])).astype(np.int32)
    if sizes.size and trial % 3 == 0:
        sizes[rng.integers(0, sizes.size, size=3)] = 700  # documents Megatron skips
    max_length = int(rng.integers(2, 120))
    short = float(rng.choice([0.0, 0.1, 0.35, 1.0]))
    seed = int(rng.integers(1, 10_000))
    min_sentences = 1 + trial % 2
    num_samples = int(rng.integers(0, 500))
    expected = mhelpers.build_mapping(
        bounds, sizes, np.iinfo(np.int32).max - 1, num_samples, max_length, short, seed, False,
        min_sentences,
    )  # fmt: skip
    if expected.shape[0] == 0 and num_samples > 0:
        pytest.skip("no eligible document: Megatron would loop for 2**31 epochs")
    actual = build_bert_sample_index(
        bounds, sizes, num_samples, max_length, short, seed, min_sentences
    )
    assert actual.dtype == expected.dtype
    np.testing.assert_array_equal(actual, expected)


OPTIONS = [
    pytest.param({}, id="defaults"),
    pytest.param({"classification_head": False}, id="no-classification-head"),
    pytest.param({"masking_do_full_word": False, "masking_max_ngram": 1}, id="pieces-1gram"),
    pytest.param({"masking_max_ngram": 4, "masking_use_longer_ngrams": True}, id="longer-ngrams"),
    pytest.param({"masking_use_geometric_distribution": True}, id="geometric"),
    pytest.param({"masking_do_permutation": True}, id="permutation"),
    pytest.param(
        {"masking_do_permutation": True, "classification_head": False, "masking_max_ngram": 2},
        id="permutation-one-segment",
    ),
    pytest.param({"short_sequence_probability": 0.5, "masking_probability": 0.3}, id="short"),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("seed", [1, 1234, 98765])
def test_every_sample_equals_megatron(corpus, options, seed):
    directory, tokenizer, prefix, _ = corpus
    config = BERTDatasetConfig(
        seq_length=SEQ, tokenizer=tokenizer, seed=seed, data_path=[prefix], **options
    )
    theirs_low = MIndexedDataset(prefix)
    documents = np.arange(theirs_low.document_indices.shape[0] - 1, dtype=np.int32)
    theirs = MBERTDataset(
        theirs_low,
        prefix,
        documents,
        250,
        Split.train,
        megatron_config(config, f"{directory}/megatron-cache", split="1"),
    )
    ours = BERTDataset(
        IndexedDataset(prefix),
        documents,
        250,
        SEQ,
        seed,
        tokenizer=tokenizer,
        masking=config.masking,
        short_sequence_probability=config.short_sequence_probability,
        classification_head=config.classification_head,
    )
    assert len(ours) >= 250
    assert_same_samples(ours, theirs, config)


@pytest.mark.parametrize(
    "data_path",
    [
        pytest.param("single", id="one-corpus"),
        pytest.param("weighted", id="weighted-blend"),
    ],
)
def test_builder_equals_megatron(corpus, tmp_path, data_path):
    directory, tokenizer, prefix, other = corpus
    paths = [prefix] if data_path == "single" else ["0.3", prefix, "0.7", other]
    config = BERTDatasetConfig(
        seq_length=SEQ,
        tokenizer=tokenizer,
        seed=5,
        data_path=paths,
        split="8,1,1",
        masking_do_permutation=True,
        path_to_cache=str(tmp_path / "ours"),
    )
    sizes = [120, 30, 20]
    theirs = BlendedMegatronDatasetBuilder(
        MBERTDataset,
        sizes,
        lambda: True,
        megatron_config(
            config,
            str(tmp_path / "megatron"),
            blend=config.blend,
            split=config.split,
            mid_level_dataset_surplus=config.mid_level_dataset_surplus,
        ),
    ).build()
    ours = build_bert_datasets(config, sizes)
    for split, (a, b) in enumerate(zip(ours, theirs)):
        assert type(a).__name__ == type(b).__name__.replace(
            "BERTMaskedWordPieceDataset", "BERTDataset"
        )
        assert len(a) == len(b), split
        for i in range(len(b)):
            np.random.seed([config.seed, *_inner_index(b, i), PERMUTATION_SEED_WORD])  # noqa: NPY002
            expected, actual = b[i], a[i]
            for key, value in expected.items():
                np.testing.assert_array_equal(actual[key], value, err_msg=f"{split} {i} {key}")


def _inner_index(dataset, i: int) -> list[int]:
    """The index inside the BERT dataset that sample ``i`` of a dataset or blend reads."""
    if hasattr(dataset, "dataset_index"):
        return [int(dataset.dataset_sample_index[i])]
    return [i]


def stdlib_paragraphs() -> list[list[str]]:
    """Documents of sentences from standard-library docstrings (offline, deterministic)."""
    import argparse
    import collections
    import json
    import textwrap

    documents = []
    for module in (argparse, collections, json, textwrap, warnings):
        for paragraph in (module.__doc__ or "").split("\n\n"):
            text = " ".join(paragraph.split())
            sentences = [s.strip() for s in text.replace("? ", ". ").split(". ") if s.strip()]
            if sentences:
                documents.append(sentences)
    return documents


@pytest.mark.parametrize("classification_head", [True, False])
def test_real_wordpiece_tokenizer_on_text(tmp_path, world_of_one, classification_head):
    """Megatron's BertWordPieceLowerCase on a sentence-split text corpus: same samples."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from epochal.data import build_tokenizer
    from epochal.data.indexed.tokenizer_wordpiece import train_wordpiece

    documents = stdlib_paragraphs()
    texts = [s for sentences in documents for s in sentences]
    vocab = train_wordpiece(texts, 400, tmp_path / "vocab.txt", min_frequency=1)
    tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file=vocab)
    tokenizer.unique_identifiers = {"class": "BertWordPieceLowerCase", "vocab": vocab}
    prefix = str(tmp_path / "text")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for sentences in documents:
        for sentence in sentences:
            builder.add_item(torch.tensor(tokenizer.tokenize(sentence), dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    config = BERTDatasetConfig(
        seq_length=64,
        tokenizer=tokenizer,
        seed=11,
        data_path=[prefix],
        split="1",
        classification_head=classification_head,
        masking_max_ngram=2,
    )
    theirs = BlendedMegatronDatasetBuilder(
        MBERTDataset,
        [100, 0, 0],
        lambda: True,
        megatron_config(config, str(tmp_path / "megatron"), blend=config.blend, split="1"),
    ).build()[0]
    ours = build_bert_datasets(config, [100, 0, 0])[0]
    assert any(ours[i]["truncated"] for i in range(len(ours)))
    assert_same_samples(ours, theirs, config)
