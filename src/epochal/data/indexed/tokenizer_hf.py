"""A Hugging Face ``tokenizers`` JSON file (``tokenizer.json``) behind :class:`Tokenizer`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from epochal.data.indexed.tokenizer_base import (
    _BOS_CANDIDATES,
    _EOD_CANDIDATES,
    _PAD_CANDIDATES,
    Tokenizer,
    TokenizerFileError,
    _check_file,
)


class HuggingFaceTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer (fast, Rust; batches in native code).

    Args:
        tokenizer_file: a ``tokenizer.json`` file, or a directory containing one.
        eod_token: the string of the end-of-document token; default: the first of
            ``<|endoftext|>``, ``<|end_of_text|>``, ``</s>``, ``<eos>``, ... in the vocabulary.
        bos_token / pad_token: likewise (``None`` result if absent).

    Any model the file holds works: BPE, WordPiece, or a SentencePiece-style Unigram
    model such as Hugging Face ``T5Tokenizer``'s (its ``</s>`` is the end of document,
    ``<pad>`` the padding, and ``<extra_id_N>`` the T5 sentinels:
    :attr:`additional_special_tokens_ids`), read offline; ids equal ``transformers``'
    ``T5TokenizerFast`` for the same file.

    Raises:
        FileNotFoundError: the file is missing.
        TokenizerFileError: the file is not a tokenizer, or no end-of-document
            token is found (pass ``eod_token``).
    """

    def __init__(
        self,
        tokenizer_file: str | os.PathLike,
        eod_token: str | None = None,
        bos_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        path = os.fspath(tokenizer_file)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        path = _check_file(path, "tokenizer file")
        try:
            backend = RustTokenizer.from_file(path)
        except Exception as exc:  # the Rust library raises plain Exception
            raise TokenizerFileError(
                f"{path}: not a Hugging Face tokenizers JSON file ({exc})"
            ) from exc
        self.source = path
        self._setup(backend, eod_token, bos_token, pad_token)

    def _setup(
        self, backend: Any, eod_token: str | None, bos_token: str | None, pad_token: str | None
    ) -> None:
        self._backend = backend
        self._tokens = (eod_token, bos_token, pad_token)
        eod = self._find(eod_token, _EOD_CANDIDATES)
        if eod is None:
            wanted = repr(eod_token) if eod_token else f"any of {', '.join(_EOD_CANDIDATES)}"
            raise TokenizerFileError(
                f"{self.source}: no end-of-document token ({wanted}) in the vocabulary; pass eod_token="
            )
        self.eod = eod
        self.bos = self._find(bos_token, _BOS_CANDIDATES)
        self.pad = self._find(pad_token, _PAD_CANDIDATES)
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def _find(self, token: str | None, candidates: Sequence[str]) -> int | None:
        for name in (token,) if token else candidates:
            token_id = self._backend.token_to_id(name)
            if token_id is not None:
                return int(token_id)
        return None

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eos(self) -> int:
        """The end-of-document id (T5's ``</s>``), Megatron's T5 name for it."""
        return self.eod

    @property
    def additional_special_tokens_ids(self) -> list[int]:
        """Ids of the sentinels ``<extra_id_0>``, ``<extra_id_1>``, ... in the vocabulary, in order.

        As Hugging Face's ``T5Tokenizer`` names them; empty when the vocabulary has none.
        """
        ids = []
        while (token_id := self._backend.token_to_id(f"<extra_id_{len(ids)}>")) is not None:
            ids.append(int(token_id))
        return ids

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._backend.encode_batch_fast(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "json": self._backend.to_str(), "tokens": self._tokens}

    def __setstate__(self, state: dict[str, Any]) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self.source = state["source"]
        self._setup(RustTokenizer.from_str(state["json"]), *state["tokens"])
