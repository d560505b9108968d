"""The tokenizer record of a preprocessed corpus: ``<prefix>.tokenizer.json`` next to its ``.idx``.

``epochal preprocess`` writes, beside ``<prefix>.bin`` / ``<prefix>.idx`` (which stay
byte for byte what Megatron-Core writes and reads), a small JSON file naming the
tokenizer that produced the ids, so that a run reading the corpus can use the same
one, or refuse another::

    {"format": 1, "tokenizer_type": "ByteLevelTokenizer", "vocab_file": null,
     "merge_file": null, "tokenizer_model": null, "tiktoken_pattern": "cl100k",
     "eod_token": null, "vocab_extra_ids": 0, "vocab_size": 259, "eod": 256,
     "fingerprint": "3b5d..."}

``tokenizer_type`` is the canonical Megatron name, file paths are absolute (or
null: the tokenizer's built-in files). ``fingerprint`` identifies the tokenizer's
ids whatever its files are called: a SHA-256 of its vocabulary size, end-of-document
id and the ids of a fixed probe text (:func:`tokenizer_fingerprint`), so the same
type with another vocabulary differs. Corpora without a record (Megatron's own
files, older ones) are read as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from epochal._atomic import atomic_write

__all__ = [
    "RECORD_SUFFIX",
    "TokenizerRecordError",
    "read_tokenizer_record",
    "record_path",
    "tokenizer_fingerprint",
    "write_tokenizer_record",
]

RECORD_SUFFIX = ".tokenizer.json"
FORMAT = 1
#: The text whose ids fingerprint a tokenizer: letters, digits, punctuation, spaces, a
#: newline and non-ASCII characters (every tokenizer maps something of it).
PROBE = "The quick brown fox, 1984: jumps over 37 lazy dogs!\n  MKTAYIAKQR éü 中文 ∑"
#: The options a record keeps, as ``build_tokenizer``'s keyword arguments name them.
OPTIONS = (
    "vocab_file",
    "merge_file",
    "tokenizer_model",
    "tiktoken_pattern",
    "eod_token",
    "vocab_extra_ids",
)


class TokenizerRecordError(ValueError):
    """A tokenizer record that cannot be read (the message names the file)."""


def record_path(prefix: str | os.PathLike) -> Path:
    """``<prefix>.tokenizer.json``."""
    return Path(f"{os.fspath(prefix)}{RECORD_SUFFIX}")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 (hex) of ``[vocab_size, eod, ids of PROBE]``: equal for tokenizers giving equal ids."""
    ids = [int(i) for i in tokenizer.encode(PROBE)]
    payload = json.dumps([int(tokenizer.vocab_size), tokenizer.eod, ids])
    return hashlib.sha256(payload.encode()).hexdigest()


def write_tokenizer_record(
    prefix: str | os.PathLike, tokenizer: Any, tokenizer_type: str, **options: Any
) -> Path:
    """Write ``prefix``'s record (atomically) and return its path.

    Args:
        prefix: the corpus prefix (``<prefix>.idx`` / ``.bin``).
        tokenizer: the tokenizer that wrote the ids (``encode``, ``vocab_size``, ``eod``).
        tokenizer_type: its canonical Megatron name (e.g. ``"ByteLevelTokenizer"``).
        **options: the :data:`OPTIONS` it was built with; file paths are stored absolute.

    Raises:
        ValueError: an option not in :data:`OPTIONS`.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown tokenizer record options {unknown} (known: {list(OPTIONS)})")
    record: dict[str, Any] = {"format": FORMAT, "tokenizer_type": tokenizer_type}
    for name in OPTIONS:
        value = options.get(name)
        if name.endswith(("_file", "_model")) and value:
            value = os.path.abspath(os.fspath(value))
        record[name] = None if value == "" else value
    record["vocab_extra_ids"] = int(options.get("vocab_extra_ids") or 0)
    record["vocab_size"] = int(tokenizer.vocab_size)
    record["eod"] = tokenizer.eod
    record["fingerprint"] = tokenizer_fingerprint(tokenizer)
    path = record_path(prefix)
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return path


def read_tokenizer_record(prefix: str | os.PathLike) -> dict[str, Any] | None:
    """The record of ``prefix``, or None when it has none.

    Raises:
        TokenizerRecordError: an unreadable, malformed or newer-format record (named).
    """
    path = record_path(prefix)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TokenizerRecordError(f"{path}: not a readable tokenizer record ({exc})") from None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("tokenizer_type"), str)
        or not isinstance(record.get("fingerprint"), str)
    ):
        raise TokenizerRecordError(
            f"{path}: not a tokenizer record (no tokenizer_type/fingerprint)"
        )
    if record.get("format") != FORMAT:
        raise TokenizerRecordError(
            f"{path}: tokenizer record format {record.get('format')!r}; this epochal reads {FORMAT}"
        )
    return record
