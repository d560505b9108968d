"""ESM-2's protein tokenizer: the 33-token alphabet, ids as ``transformers``' ``EsmTokenizer``.

The alphabet, in ``EsmTokenizer``'s (and fair-esm's) order, id = position::

    <cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - <null_1> <mask>

Encoding follows ``EsmTokenizer``: every vocabulary token written in the text (one
residue letter, ``<mask>``, ``<cls>``, ...) is matched, longest first, left to right;
what lies between matches is split at whitespace and each piece (e.g. ``mkta``, a
lower-case run, or ``J``) becomes a single ``<unk>``. No ``<cls>``/``<eos>`` is added
(``EsmTokenizer.encode(..., add_special_tokens=False)``); ``eod`` is ``<eos>``, so
``preprocess --append-eod`` ends each protein with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from epochal.data.indexed.tokenizer_base import Tokenizer, TokenizerFileError, _check_file

__all__ = ["ESM2_ALPHABET", "ESM2Tokenizer"]

ESM2_ALPHABET = (
    "<cls> <pad> <eos> <unk> L A G V S E R T I D P K Q N F Y M H W C X B U Z O . - <null_1> <mask>"
).split()

_REQUIRED = ("<cls>", "<pad>", "<eos>", "<unk>", "<mask>")


class ESM2Tokenizer(Tokenizer):
    """ESM-2's amino-acid tokenizer (ids equal ``EsmTokenizer``'s for the same vocabulary).

    Args:
        vocab_file: an ESM ``vocab.txt`` (one token per line); default: ESM-2's
            33-token alphabet (:data:`ESM2_ALPHABET`), which is what ESM-2 checkpoints ship.

    Attributes:
        cls (= bos), pad, eos (= eod = sep), unk, mask: the special ids (0, 1, 2, 3, 32
            for ESM-2's alphabet), also as ``cls_id``, ``pad_id``, ``mask_id``, ...
        vocab: token -> id; inv_vocab: id -> token.
        unique_identifiers: the description Megatron-Core's datasets serialize.

    Raises:
        FileNotFoundError: ``vocab_file`` is missing.
        TokenizerFileError: the file repeats a token or lacks ``<cls> <pad> <eos> <unk> <mask>``.
    """

    def __init__(self, vocab_file: str | os.PathLike | None = None) -> None:
        if vocab_file is None:
            self.source = "ESM-2 alphabet"
            tokens = list(ESM2_ALPHABET)
        else:
            self.source = _check_file(vocab_file, "ESM vocabulary file (--vocab-file)")
            with open(self.source, encoding="utf-8") as stream:
                tokens = [line.strip() for line in stream if line.strip()]
            if len(set(tokens)) != len(tokens):
                raise TokenizerFileError(f"{self.source}: a token is listed twice")
            for token in _REQUIRED:
                if token not in tokens:
                    raise TokenizerFileError(f"{self.source}: the ESM vocabulary has no {token}")
        self._tokens = tokens
        self._build()

    def _build(self) -> None:
        self.vocab = {token: i for i, token in enumerate(self._tokens)}
        self.inv_vocab = dict(enumerate(self._tokens))
        self.cls = self.cls_id = self.bos = self.vocab["<cls>"]
        self.pad = self.pad_id = self.vocab["<pad>"]
        self.eos = self.eod = self.sep = self.sep_id = self.vocab["<eos>"]
        self.unk = self.vocab["<unk>"]
        self.mask = self.mask_id = self.vocab["<mask>"]
        self.unique_identifiers = {"class": "ESM2Tokenizer", "tokenizer_path": [self.source]}
        by_length = sorted(self._tokens, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(map(re.escape, by_length)) + ")")
        # one-letter tokens that begin no longer token: text of them encodes letter by letter
        starts = {t[0] for t in self._tokens if len(t) > 1}
        self._letters = "".join(
            t for t in self._tokens if len(t) == 1 and not t.isspace() and t not in starts
        ).encode("utf-8")

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "tokens": self._tokens}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source = state["source"]
        self._tokens = state["tokens"]
        self._build()

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str) -> list[int]:
        vocab, unk = self.vocab, self.unk
        ids: list[int] = []
        # re.split with a group alternates: unmatched text, token, unmatched text, ...
        for position, part in enumerate(self._splitter.split(text)):
            if position % 2:
                ids.append(vocab[part])
            elif part:
                ids.extend(unk for _ in part.split())
        return ids

    def one_token_per_character(self, text: str) -> bool:
        """Whether ``text`` encodes to one token per character (each a one-letter token).

        Then ``encode(text[:k]) == encode(text)[:k]``: a long protein can be cut before it
        is encoded (every sequence the protein readers return qualifies).
        """
        from epochal.data.proteins.sequences import only_characters

        if not text.isascii():
            return not text.strip(self._letters.decode("utf-8"))
        return only_characters(text, self._letters)

    def tokenize(self, text: str) -> list[int]:
        """Megatron's name for :meth:`encode`."""
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """The tokens joined by spaces (``EsmTokenizer.decode``); special tokens spelled out.

        Raises:
            KeyError: an id outside ``[0, vocab_size)``.
        """
        return " ".join(self.inv_vocab[int(i)] for i in ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Megatron's name for :meth:`decode`."""
        return self.decode(ids)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The token of each id (``EsmTokenizer.convert_ids_to_tokens``).

        Raises:
            KeyError: an id outside ``[0, vocab_size)``.
        """
        return [self.inv_vocab[int(i)] for i in ids]

    def hf_tokenizer_files(self, model_max_length: int = 1026) -> dict[str, str]:
        """The files ``transformers.AutoTokenizer`` reads as this tokenizer (an ``EsmTokenizer``).

        Args:
            model_max_length: the longest input in tokens (ESM-2: 1026).

        Returns:
            ``{"vocab.txt", "tokenizer_config.json", "special_tokens_map.json": text}``,
            as ``facebook/esm2_*`` folders ship them.
        """
        import json

        special = {
            "cls_token": "<cls>",
            "eos_token": "<eos>",
            "mask_token": "<mask>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
        }
        config = {"tokenizer_class": "EsmTokenizer", "model_max_length": model_max_length}

        def dump(obj: dict[str, Any]) -> str:
            return json.dumps(obj, indent=2, sort_keys=True) + "\n"

        return {
            "vocab.txt": "\n".join(self._tokens) + "\n",
            "tokenizer_config.json": dump({**config, **special}),
            "special_tokens_map.json": dump(special),
        }
