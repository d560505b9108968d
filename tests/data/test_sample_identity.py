"""``sample_identity``: every dataset names its samples without reading them, and the names are right.

GPT windows name the token ranges they are cut from (reading those ranges gives the
sample's tokens), blends name their corpus and that corpus' sample, BERT samples their
document and sentences, resamplers their epoch (one sample at a time or a range at
once, across an epoch boundary), fine-tuning tables their rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from epochal.data import (
    BERTDatasetConfig,
    BlendedDataset,
    GPTDataset,
    IdentityMultiEpochDatasetWrapper,
    MultiEpochDatasetResampler,
    build_bert_datasets,
)
from epochal.data.datasets.labelled import LabelledSequenceDataset
from epochal.data.datasets.mock_gpt import MockGPTLowLevelDataset
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from tests.data.bert_corpus import (
    BertVocabTokenizer,
    random_sentence_documents,
    write_sentence_corpus,
    write_vocab,
)


def read_ranges(low, spans) -> np.ndarray:
    return np.concatenate([low.get(d, offset=a, length=b - a) for d, a, b in spans])


def test_gpt_windows_name_the_token_ranges_they_read():
    low = MockGPTLowLevelDataset(100, 99, num_documents=30, max_sequence_length=40, seed=3)
    gpt = GPTDataset(low, None, 200, 16, seed=5)
    assert gpt.num_epochs > 1
    epochs = set()
    for i in range(len(gpt)):
        ident = gpt.sample_identity(i)
        assert ident["dataset"] == "MockGPTLowLevelDataset"
        assert ident["window"] == int(gpt.shuffle_index[i])
        tokens, documents = gpt.window(i)
        assert [d for d, _, _ in ident["documents"]] == documents.tolist()
        assert np.array_equal(read_ranges(low, ident["documents"]), tokens)
        epochs.add(ident["epoch"])
    assert epochs == set(range(gpt.num_epochs))
    with pytest.raises(IndexError):
        gpt.sample_identity(len(gpt))


def test_blends_name_the_corpus_and_its_sample():
    lows = [MockGPTLowLevelDataset(100, 99, num_documents=20, seed=s) for s in (1, 2)]
    parts = [GPTDataset(low, None, 100, 8, seed=9) for low in lows]
    blend = BlendedDataset(parts, [0.3, 0.7], 100)
    corpora = set()
    for i in range(len(blend)):
        ident = blend.sample_identity(i)
        k, j = int(blend.dataset_index[i]), int(blend.dataset_sample_index[i])
        assert ident == {"corpus": k, **parts[k].sample_identity(j)}
        tokens = read_ranges(lows[k], ident["documents"])
        assert np.array_equal(tokens[:-1], blend[i]["tokens"].numpy())
        corpora.add(k)
    assert corpora == {0, 1}


def test_bert_samples_name_their_document_and_sentences(tmp_path):
    tokenizer = BertVocabTokenizer(write_vocab(str(tmp_path)))
    docs = random_sentence_documents(3, 30)
    prefix = write_sentence_corpus(str(tmp_path), "corpus", docs, megatron=False)
    config = BERTDatasetConfig(seq_length=40, tokenizer=tokenizer, data_path=[prefix], split="1")
    train = build_bert_datasets(config, [40, 0, 0])[0]
    bounds = np.cumsum([0, *(len(d) for d in docs)])
    for i in range(len(train)):
        ident = train.sample_identity(i)
        first, last = ident["sentences"]
        assert ident["dataset"] == "corpus" and ident["index"] == i
        assert (first, last + 1) == train.sample_span(i)
        d = ident["document"]
        assert bounds[d] <= first <= last < bounds[d + 1]
        sample = train[i]
        text = np.where(sample["loss_mask"] == 1, sample["labels"], sample["text"])
        words = set(np.concatenate(docs[d][first - bounds[d] : last + 1 - bounds[d]]).tolist())
        kept = text[sample["padding_mask"] == 1][1:]
        assert set(kept.tolist()) - {tokenizer.sep} <= words


def test_resamplers_name_epochs_one_at_a_time_or_a_range_at_once():
    rows = LabelledSequenceDataset(
        ["MKV", "AAL", "GGS"],
        ["1.0", "2.0", "3.0"],
        ESM2Tokenizer(),
        task="sequence_regression",
        seq_length=8,
        ids=["4", "9", "seq-x"],
    )
    resampler = MultiEpochDatasetResampler(
        IdentityMultiEpochDatasetWrapper(rows), num_samples=10, seed=3
    )
    one = [resampler.sample_identity(g) for g in range(10)]
    assert resampler.sample_identities(2, 8) == one[2:8]
    for g, ident in enumerate(one):
        key = resampler.epoch_index(g)
        assert ident == {"epoch": key.epoch, "row": [4, 9, "seq-x"][key.idx]}
    assert [i["epoch"] for i in one] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    plain = MultiEpochDatasetResampler(IdentityMultiEpochDatasetWrapper(list("ab")), num_epochs=2)
    assert plain.sample_identity(3) == {"epoch": 1, "index": plain.epoch_index(3).idx}
