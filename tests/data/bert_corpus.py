"""A small WordPiece vocabulary, tokenizer adapter and sentence-split corpora (not a test module)."""

from __future__ import annotations

import os

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(60)]
PIECES = [f"##p{i}" for i in range(30)]


def write_vocab(directory: str) -> str:
    """Write a ``vocab.txt`` of specials, words and ``##`` pieces; return its path."""
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(SPECIALS + WORDS + PIECES) + "\n")
    return path


class BertVocabTokenizer:
    """Megatron's BERT tokenizer interface over ``transformers.BertTokenizer``.

    ``cls sep mask pad vocab_size vocab inv_vocab`` as Megatron's ``BertWordPieceLowerCase``;
    ``unique_identifiers`` lets Megatron-Core describe its datasets.
    """

    def __init__(self, vocab_file: str) -> None:
        from transformers import BertTokenizer

        self._hf = BertTokenizer(vocab_file, do_lower_case=True)
        self.vocab = dict(self._hf.vocab)
        self.inv_vocab = {i: t for t, i in self.vocab.items()}
        self.vocab_size = len(self.vocab)
        self.cls = self.vocab["[CLS]"]
        self.sep = self.vocab["[SEP]"]
        self.mask = self.vocab["[MASK]"]
        self.pad = self.vocab["[PAD]"]
        self.unique_identifiers = {"class": "BertVocabTokenizer", "vocab_file": vocab_file}

    def tokenize(self, text: str) -> list[int]:
        return self._hf.convert_tokens_to_ids(self._hf.tokenize(text))


def random_sentence_documents(
    seed: int, count: int, max_sentences: int = 6, max_words: int = 12, min_sentences: int = 1
) -> list[list[np.ndarray]]:
    """``count`` documents of 1..max_sentences sentences of WordPiece ids (words + ##pieces)."""
    rng = np.random.default_rng(seed)
    first_word, first_piece = len(SPECIALS), len(SPECIALS) + len(WORDS)
    docs = []
    for _ in range(count):
        sentences = []
        for _ in range(int(rng.integers(min_sentences, max_sentences + 1))):
            ids = []
            for _ in range(int(rng.integers(1, max_words + 1))):
                ids.append(int(rng.integers(first_word, first_piece)))
                ids.extend(
                    int(v)
                    for v in rng.integers(
                        first_piece, first_piece + len(PIECES), rng.integers(0, 3)
                    )
                )
            sentences.append(np.asarray(ids, dtype=np.int64))
        docs.append(sentences)
    return docs


def write_sentence_corpus(
    directory: str, name: str, docs: list[list[np.ndarray]], megatron: bool = True
) -> str:
    """Write sentence-split documents (Megatron-Core's builder, or epochal's); return the prefix."""
    import torch

    if megatron:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    else:
        from epochal.data.indexed.indexed_dataset import IndexedDatasetBuilder

    prefix = os.path.join(directory, name)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for sentences in docs:
        for sentence in sentences:
            builder.add_item(torch.from_numpy(np.asarray(sentence, dtype=np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
