"""BERT's WordPiece tokenizer from a ``vocab.txt`` (Megatron's ``BertWordPieceLowerCase`` /
``BertWordPieceCase``), and training such a vocabulary offline.

:class:`BertWordPieceTokenizer` gives the ids of ``transformers``' ``BertTokenizer`` built
from the same file (``do_lower_case`` = ``lower_case``; BERT normalization: control
characters removed, Chinese characters split, accents stripped when lower-casing), and
the attributes Megatron's ``_BertWordPieceTokenizer`` has, which Megatron-Core's BERT and
T5 datasets read: ``cls``/``sep``/``pad``/``mask`` (and ``cls_id``-style aliases),
``bos``/``eos``, ``vocab`` (token -> id), ``inv_vocab`` (id -> token), ``vocab_size``,
``tokenize(text) -> ids`` and ``detokenize(ids)``.

As Megatron's, the tokenizer appends ``[BOS]`` and ``[EOS]`` (then ``<extra_id_i>`` for
``vocab_extra_ids``) to the vocabulary when the file lacks them, so ``vocab_size`` is the
file's line count plus those; text never encodes to them unless written literally.
``eod`` (what ``preprocess --append-eod`` appends; Megatron's BERT tokenizer has none)
is the ``[EOS]`` id. Special tokens written in the text (``[MASK]``, ``[SEP]``, ...)
encode as their id, as ``BertTokenizer`` does.

:func:`train_wordpiece` trains a vocabulary offline with Hugging Face ``tokenizers``
(deterministic for the same texts and settings).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from epochal._atomic import atomic_path
from epochal.data.indexed.tokenizer_base import Tokenizer, TokenizerFileError, _check_file

__all__ = ["BERT_SPECIAL_TOKENS", "BertWordPieceTokenizer", "train_wordpiece"]

# The tokens a BERT vocabulary must hold, in the order BERT's own vocabularies list them.
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: the most ``<extra_id_N>`` sentinels a tokenizer takes (T5 uses 100, ByT5 125)
MAX_VOCAB_EXTRA_IDS = 100_000
_NOT_ORDINARY = re.compile(r"^(\[(PAD|UNK|CLS|SEP|MASK|BOS|EOS|unused\d+)\]|<extra_id_\d+>)$")


def read_vocab_file(path: str) -> dict[str, int]:
    """Read a ``vocab.txt``: one token per line, id = line number - 1 (as BERT's ``load_vocab``).

    Raises:
        FileNotFoundError: the file is missing.
        TokenizerFileError: not UTF-8 text, empty, or a token repeated.
    """
    path = _check_file(path, "BERT vocabulary file (--vocab-file)")
    try:
        with open(path, encoding="utf-8") as stream:
            tokens = [line.rstrip("\n") for line in stream]
    except UnicodeDecodeError as exc:
        raise TokenizerFileError(f"{path}: not a UTF-8 vocab.txt ({exc})") from exc
    if not tokens:
        raise TokenizerFileError(f"{path}: empty vocabulary")
    vocab: dict[str, int] = {}
    for number, token in enumerate(tokens):
        if token in vocab:
            raise TokenizerFileError(
                f"{path}:{number + 1}: token {token!r} repeats line {vocab[token] + 1}"
            )
        vocab[token] = number
    return vocab


class BertWordPieceTokenizer(Tokenizer):
    """BERT WordPiece from a ``vocab.txt`` (Megatron's ``BertWordPieceLowerCase``/``Case``).

    Args:
        vocab_file: one token per line; must hold ``[PAD] [UNK] [CLS] [SEP] [MASK]``.
        lower_case: lower-case and strip accents first (``BertWordPieceLowerCase``).
        vocab_extra_ids: add ``<extra_id_0>`` ... (T5 sentinels), as Megatron's argument.

    Attributes:
        cls, sep, pad, mask, unk: ids of ``[CLS]``, ``[SEP]``, ``[PAD]``, ``[MASK]``, ``[UNK]``
            (also as ``cls_id``, ``sep_id``, ``pad_id``, ``mask_id``).
        bos, eos: ids of ``[BOS]``/``[EOS]`` (appended when the file lacks them).
        eod: the ``[EOS]`` id.
        vocab: token -> id (``dict``); inv_vocab: id -> token.
        lower_case: as given.
        unique_identifiers: Megatron's tokenizer description (class, vocabulary path),
            which Megatron-Core's datasets serialize.

    Raises:
        FileNotFoundError: the vocabulary file is missing.
        TokenizerFileError: the file is malformed, lacks a special token or holds
            nothing but special tokens (the file named).
        ValueError: ``vocab_extra_ids`` outside ``0..MAX_VOCAB_EXTRA_IDS``.
    """

    def __init__(
        self, vocab_file: str | os.PathLike, lower_case: bool = True, vocab_extra_ids: int = 0
    ) -> None:
        path = os.fspath(vocab_file)
        file_vocab = read_vocab_file(path)
        for token in BERT_SPECIAL_TOKENS:
            if token not in file_vocab:
                raise TokenizerFileError(
                    f"{path}: the BERT vocabulary has no {token} token "
                    f"(a BERT vocab.txt holds {' '.join(BERT_SPECIAL_TOKENS)})"
                )
        if not any(_NOT_ORDINARY.match(token) is None for token in file_vocab):
            raise TokenizerFileError(
                f"{path}: the BERT vocabulary holds only special tokens ({len(file_vocab)} of "
                "them, e.g. [PAD] [CLS] [unused0]): there is no ordinary token to encode text "
                "with or to mask"
            )
        if not 0 <= vocab_extra_ids <= MAX_VOCAB_EXTRA_IDS:
            raise ValueError(
                f"vocab_extra_ids (--vocab-extra-ids) must be between 0 and "
                f"{MAX_VOCAB_EXTRA_IDS:,}, got {vocab_extra_ids:,} (T5 uses 100)"
            )
        self.source = path
        self._state = {
            "vocab": file_vocab,
            "lower_case": bool(lower_case),
            "extra": int(vocab_extra_ids),
        }
        self._build()

    def _build(self) -> None:
        from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers
        from tokenizers import Tokenizer as RustTokenizer
        from tokenizers.models import WordPiece

        state = self._state
        file_vocab: dict[str, int] = state["vocab"]
        self.lower_case = state["lower_case"]
        engine = RustTokenizer(WordPiece(dict(file_vocab), unk_token="[UNK]"))
        engine.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=True,
            strip_accents=None,
            lowercase=self.lower_case,
        )
        engine.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        engine.decoder = decoders.WordPiece(prefix="##")
        engine.add_special_tokens([AddedToken(t, special=True) for t in BERT_SPECIAL_TOKENS])
        self._engine = engine
        # Megatron's vocabulary: the file's, then [BOS], [EOS] and the extra ids if absent.
        vocab = dict(file_vocab)
        added = ["[BOS]", "[EOS]", *(f"<extra_id_{i}>" for i in range(state["extra"]))]
        for token in added:
            vocab.setdefault(token, len(vocab))
        self.vocab = vocab
        self.inv_vocab = {i: t for t, i in vocab.items()}
        self.additional_special_tokens = added[2:]
        self.cls = self.cls_id = vocab["[CLS]"]
        self.sep = self.sep_id = vocab["[SEP]"]
        self.pad = self.pad_id = vocab["[PAD]"]
        self.mask = self.mask_id = vocab["[MASK]"]
        self.unk = vocab["[UNK]"]
        self.bos_token, self.eos_token = "[BOS]", "[EOS]"
        self.bos = vocab["[BOS]"]
        self.eos = self.eod = vocab["[EOS]"]
        # what Megatron-Core's datasets put in their description (and cache hash)
        self.unique_identifiers = {
            "class": "BertWordPieceLowerCase" if self.lower_case else "BertWordPieceCase",
            "tokenizer_path": [self.source],
            "vocab_extra_ids": str(state["extra"]),
        }

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "state": self._state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source = state["source"]
        self._state = state["state"]
        self._build()

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        """Ids of the ``<extra_id_i>`` tokens (Megatron's name)."""
        return [self.vocab[t] for t in self.additional_special_tokens]

    def encode(self, text: str) -> list[int]:
        return self._engine.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._engine.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def tokenize(self, text: str) -> list[int]:
        """Megatron's name for :meth:`encode`: the ids of ``text``."""
        return self.encode(text)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The token strings of ``ids`` (``##`` marks a word continuation).

        Raises:
            KeyError: an id outside ``[0, vocab_size)``.
        """
        return [self.inv_vocab[int(i)] for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """Tokens joined by spaces with ``##`` continuations glued on (BERT's
        ``convert_tokens_to_string``); special tokens are spelled out."""
        return " ".join(self.convert_ids_to_tokens(ids)).replace(" ##", "").strip()

    def detokenize(self, ids: Sequence[int]) -> str:
        """Megatron's name for :meth:`decode`."""
        return self.decode(ids)

    def decode_token_ids(self, ids: Sequence[int]) -> str:
        """Megatron's ``decode_token_ids``: as :meth:`decode` without ``[PAD]``/``[CLS]``,
        each word preceded by a space."""
        words = [t for t in self.convert_ids_to_tokens(ids) if t not in ("[PAD]", "[CLS]")]
        return "".join(t[2:] if t.startswith("##") else " " + t for t in words)


# Continuation characters (BERT's "##x") are trained as one private-use character each:
# x -> chr(_SHIFT + ord(x)), so that the trainer sees a plain alphabet it sorts by code point.
_SHIFT = 0xF0000
_MAX_SHIFTED = 0x10FFFF - _SHIFT


class _Shift(dict):
    """``str.translate`` table: every character to its continuation stand-in."""

    def __missing__(self, code: int) -> int:
        return _SHIFT + code


def _wordpiece_words(texts: Iterable[str], lowercase: bool) -> Counter[str]:
    """BERT-normalized, BERT-pre-tokenized words of ``texts`` with their counts."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    splitter = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(text)))
    return counts


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    output: str | os.PathLike,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 2000,
) -> str:
    """Train a BERT WordPiece vocabulary on ``texts`` and write it as ``vocab.txt``.

    The algorithm of Hugging Face ``tokenizers``' ``WordPieceTrainer`` (BPE merges
    by frequency over BERT-normalized, BERT-pre-tokenized words, ``##`` marking a
    word continuation), made deterministic: that trainer numbers the ``##x``
    pieces in hash-map order, so its ties (and its output) vary from run to run.
    Here words are counted in Python and each continuation character is given to
    ``tokenizers``' BPE trainer as a private-use stand-in, so every piece has a
    fixed id and ties break the same way: the same texts and settings give the same
    bytes. Words with a continuation character above U+1FFFF (outside the stand-in
    range) or starting with a plane-15/16 private-use character are not counted.

    The file starts with ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (ids 0-4), then the
    characters and ``##`` characters by code point, then the merges in the order
    learned. Written atomically (a reader never sees half a file).

    Args:
        texts: the training corpus (consumed once).
        vocab_size: the number of tokens wanted (the result may be smaller when the
            corpus has fewer distinct pieces).
        output: the ``vocab.txt`` path, or an existing folder to write ``vocab.txt`` in.
        lowercase: lower-case and strip accents (``BertWordPieceLowerCase``); ``False``
            for ``BertWordPieceCase``.
        min_frequency: a merge must occur this many times.
        limit_alphabet: at most this many distinct characters (word-initial and
            ``##`` ones together), the most frequent.

    Returns:
        The path of the written ``vocab.txt``.

    Raises:
        ValueError: ``vocab_size`` too small to hold the special tokens.
    """
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    if vocab_size <= len(BERT_SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size must exceed the {len(BERT_SPECIAL_TOKENS)} special tokens, got {vocab_size}"
        )
    path = os.fspath(output)
    if os.path.isdir(path):
        path = os.path.join(path, "vocab.txt")
    shift = _Shift()
    shifted: list[tuple[str, int]] = []
    for word, count in sorted(_wordpiece_words(texts, lowercase).items()):
        if ord(word[0]) >= _SHIFT or any(ord(c) > _MAX_SHIFTED for c in word[1:]):
            continue
        shifted.append((word[0] + word[1:].translate(shift), count))

    def repeated_words() -> Iterator[str]:
        for word, count in shifted:
            yield " ".join([word] * count)

    engine = RustTokenizer(models.BPE())
    engine.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        special_tokens=list(BERT_SPECIAL_TOKENS),
        show_progress=False,
    )
    engine.train_from_iterator(repeated_words(), trainer=trainer, length=len(shifted))
    vocab = engine.get_vocab(with_added_tokens=True)
    tokens = []
    for token in sorted(vocab, key=vocab.__getitem__):
        plain = "".join(chr(ord(c) - _SHIFT) if ord(c) >= _SHIFT else c for c in token)
        tokens.append("##" + plain if ord(token[0]) >= _SHIFT else plain)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as stream:
        stream.write("".join(token + "\n" for token in tokens))
    return path
