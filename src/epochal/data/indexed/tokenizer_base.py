"""The tokenizer interface, its file error, and the byte-level tokenizer.

Every tokenizer has ``encode(text) -> list[int]``, ``encode_batch(texts)``,
``decode(ids) -> str``, ``vocab_size``, ``eod``, ``bos`` and ``pad`` (see
:mod:`epochal.data.indexed.tokenizer`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence


class TokenizerFileError(ValueError):
    """A tokenizer file is missing, unreadable or malformed; the message names it."""


class Tokenizer(ABC):
    """The interface every tokenizer implements.

    Attributes:
        eod: end-of-document id.
        bos: beginning-of-sequence id, or ``None``.
        pad: padding id, or ``None``.
    """

    eod: int
    bos: int | None = None
    pad: int | None = None

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids; every id is in ``[0, vocab_size)``."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Return the ids of ``text`` (no BOS/EOS added)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Return ``[encode(t) for t in texts]``, faster where the backend batches."""
        return [self.encode(text) for text in texts]

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of ``ids`` (invalid UTF-8 is replaced by U+FFFD; special ids are spelled out)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, eod={self.eod})"


class ByteLevelTokenizer(Tokenizer):
    """UTF-8 bytes as ids (0-255) plus three special ids; needs no file.

    Attributes:
        eod: 256, spelled ``<|endoftext|>`` by :meth:`decode`.
        bos: 257 (``<|bos|>``).
        pad: 258 (``<|pad|>``).
    """

    SPECIALS = {256: "<|endoftext|>", 257: "<|bos|>", 258: "<|pad|>"}

    def __init__(self) -> None:
        self.eod, self.bos, self.pad = 256, 257, 258

    @property
    def vocab_size(self) -> int:
        return 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token in ids:
            token = int(token)
            if 0 <= token < 256:
                pending.append(token)
                continue
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            parts.append(self.SPECIALS.get(token, f"<|id {token}|>"))
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)


def _check_file(path: str | os.PathLike, what: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} not found")
    return path


# Common spellings of special tokens, used when a tokenizer.json does not say which is which.
_EOD_CANDIDATES = (
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "<|im_end|>",
    "[SEP]",
    "<eod>",
)
_BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "[CLS]")
_PAD_CANDIDATES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")
