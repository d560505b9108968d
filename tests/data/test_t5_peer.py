"""Peer tests: every T5 sample equals Megatron-Core 0.16.1's T5MaskedWordPieceDataset.

Both read the same sentence-split files (written by Megatron-Core's builder) with the same
WordPiece tokenizer with sentinels (epochal's BertWordPieceTokenizer, vocab_extra_ids=100,
which has Megatron's tokenizer interface). Megatron draws the permutation N-gram sizes from
numpy's global generator; the test seeds it as epochal seeds its own per-sample generator.
"""

import warnings

import numpy as np
import pytest

from epochal.data import T5Dataset, T5DatasetConfig, build_t5_datasets
from epochal.data.datasets.bert_dataset import PERMUTATION_SEED_WORD
from epochal.data.indexed.indexed_dataset import IndexedDataset
from epochal.data.indexed.tokenizer_wordpiece import BertWordPieceTokenizer
from tests.data.bert_corpus import random_sentence_documents, write_sentence_corpus, write_vocab

pytestmark = [pytest.mark.peer, pytest.mark.timeout(300)]

pytest.importorskip("megatron.core.datasets.t5_dataset")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexedDataset
    from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset as MT5Dataset
    from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDatasetConfig as MConfig
    from megatron.core.datasets.utils import Split

SEQ, DEC = 48, 32
MASKING_FIELDS = (
    "masking_probability",
    "short_sequence_probability",
    "masking_max_ngram",
    "masking_do_full_word",
    "masking_do_permutation",
    "masking_use_longer_ngrams",
    "masking_use_geometric_distribution",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, world_of_one):
    directory = str(tmp_path_factory.mktemp("t5"))
    tokenizer = BertWordPieceTokenizer(write_vocab(directory), vocab_extra_ids=100)
    prefix = write_sentence_corpus(directory, "a", random_sentence_documents(0, 60))
    other = write_sentence_corpus(directory, "b", random_sentence_documents(1, 40, max_words=25))
    return directory, tokenizer, prefix, other


def megatron_config(config: T5DatasetConfig, cache: str, **kwargs) -> MConfig:
    return MConfig(
        random_seed=config.seed,
        sequence_length=config.seq_length,
        sequence_length_decoder=config.seq_length_decoder,
        tokenizer=config.tokenizer,
        path_to_cache=cache,
        **{name: getattr(config, name) for name in MASKING_FIELDS},
        **kwargs,
    )


def assert_same_samples(ours, theirs, config: T5DatasetConfig) -> None:
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        np.random.seed([config.seed, i, PERMUTATION_SEED_WORD])  # noqa: NPY002 - Megatron reads it
        expected, actual = theirs[i], ours[i]
        assert list(actual) == list(expected)
        for key, value in expected.items():
            if isinstance(value, np.ndarray):
                assert actual[key].dtype == value.dtype, (i, key)
                np.testing.assert_array_equal(actual[key], value, err_msg=f"sample {i} {key}")
            else:
                assert type(actual[key]) is type(value) and actual[key] == value, (i, key)


OPTIONS = [
    pytest.param({}, id="megatron-t5-defaults"),
    pytest.param(
        {"masking_use_geometric_distribution": False, "masking_max_ngram": 3}, id="1/n-ngrams"
    ),
    pytest.param(
        {
            "masking_use_geometric_distribution": False,
            "masking_max_ngram": 4,
            "masking_use_longer_ngrams": True,
        },
        id="longer-ngrams",
    ),
    pytest.param(
        {"masking_use_geometric_distribution": False, "masking_do_permutation": True},
        id="permutation",
    ),
    pytest.param({"masking_do_full_word": False, "masking_max_ngram": 2}, id="pieces"),
    pytest.param({"short_sequence_probability": 0.5, "masking_probability": 0.3}, id="short"),
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("seed", [1, 1234, 98765])
def test_every_sample_equals_megatron(corpus, options, seed):
    directory, tokenizer, prefix, _ = corpus
    config = T5DatasetConfig(
        seq_length=SEQ,
        seq_length_decoder=DEC,
        tokenizer=tokenizer,
        seed=seed,
        data_path=[prefix],
        **options,
    )
    low = MIndexedDataset(prefix)
    documents = np.arange(low.document_indices.shape[0] - 1, dtype=np.int32)
    theirs = MT5Dataset(
        low,
        prefix,
        documents,
        200,
        Split.train,
        megatron_config(config, f"{directory}/megatron-cache", split="1"),
    )
    ours = T5Dataset(
        IndexedDataset(prefix),
        documents,
        200,
        SEQ,
        DEC,
        seed,
        tokenizer=tokenizer,
        masking=config.masking,
        short_sequence_probability=config.short_sequence_probability,
    )
    assert len(ours) >= 200
    sample = ours[0]
    assert (sample["text_enc"] >= tokenizer.additional_special_tokens_ids[0]).any()  # sentinels
    assert_same_samples(ours, theirs, config)


def test_weighted_blend_builder_equals_megatron(corpus, tmp_path):
    directory, tokenizer, prefix, other = corpus
    config = T5DatasetConfig(
        seq_length=SEQ,
        seq_length_decoder=DEC,
        tokenizer=tokenizer,
        seed=5,
        data_path=["0.3", prefix, "0.7", other],
        split="8,1,1",
        masking_use_geometric_distribution=False,
        masking_do_permutation=True,
    )
    sizes = [150, 30, 10]
    ours = build_t5_datasets(config, sizes)
    mconfig = megatron_config(
        config,
        str(tmp_path / "megatron-cache"),
        blend=([prefix, other], [0.3, 0.7]),
        split="8,1,1",
    )
    theirs = BlendedMegatronDatasetBuilder(MT5Dataset, sizes, lambda: True, mconfig).build()
    for mine, reference in zip(ours, theirs):
        assert len(mine) == len(reference)
        for i in range(len(reference)):
            # a blend's sample i is its corpus's sample j: seed Megatron's global state with j
            _, j = reference.dataset_index[i], reference.dataset_sample_index[i]
            np.random.seed([config.seed, int(j), PERMUTATION_SEED_WORD])  # noqa: NPY002
            expected, actual = reference[i], mine[i]
            for key, value in expected.items():
                np.testing.assert_array_equal(actual[key], value, err_msg=f"{i} {key}")


def test_clear_errors(corpus, tmp_path):
    directory, tokenizer, prefix, _ = corpus
    plain = BertWordPieceTokenizer(write_vocab(str(tmp_path)))
    with pytest.raises(ValueError, match="no sentinel tokens.*vocab_extra_ids"):
        T5DatasetConfig(seq_length=SEQ, tokenizer=plain, data_path=[prefix])
    with pytest.raises(ValueError, match="seq_length_decoder=8 is too short.*at least 14"):
        T5DatasetConfig(
            seq_length=SEQ,
            seq_length_decoder=8,
            tokenizer=tokenizer,
            data_path=[prefix],
            masking_probability=0.27,
        )
    with pytest.raises(ValueError, match="classification_head must be false"):
        T5DatasetConfig(
            seq_length=SEQ, tokenizer=tokenizer, data_path=[prefix], classification_head=True
        )
    # a decoder that fits one span but not this sample's several spans: a clear error, not an assert
    low = IndexedDataset(prefix)
    config = T5DatasetConfig(
        seq_length=SEQ,
        seq_length_decoder=8,
        tokenizer=tokenizer,
        data_path=[prefix],
        masking_use_geometric_distribution=False,
        masking_max_ngram=1,
    )
    dataset = T5Dataset(low, None, 50, SEQ, 8, 3, tokenizer=tokenizer, masking=config.masking)
    with pytest.raises(ValueError, match="needs .* decoder tokens.*seq_length_decoder=8"):
        for i in range(len(dataset)):
            dataset[i]
