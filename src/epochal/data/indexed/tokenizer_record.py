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
type with another vocabulary differs. A corpus without a record (Megatron's own
files, for one) is read without one: the configuration's tokenizer applies. A record
name that exists but holds no readable record (a dangling link, a directory, an empty,
truncated or malformed file) is an error naming it, never read as "no record".
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from epochal._atomic import atomic_write
from epochal._checks import is_int
from epochal.data.indexed.tokenizer import canonical_tokenizer_type

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


#: the most bytes a record may have (one is a few hundred bytes).
MAX_RECORD_BYTES = 1 << 20
_FIX = (
    "rewrite it by preprocessing the corpus again with epochal preprocess, or remove it and "
    "set data.tokenizer_type (and its files) to the tokenizer that wrote the corpus"
)


def read_tokenizer_record(prefix: str | os.PathLike) -> dict[str, Any] | None:
    """The record of ``prefix``, or None when no file of that name exists.

    A name that exists but is no readable record is an error, never taken as "no record"
    (which would mean GPT-2's tokenizer for a corpus written with another): a dangling
    symbolic link, a directory, a file that cannot be read, an empty or truncated file,
    JSON that is not an object, fields of the wrong type (``tokenizer_type`` not a
    tokenizer epochal knows, ``vocab_size`` not a positive integer, ``fingerprint`` not
    64 hex digits, a file option not a string, ...), a newer format.

    Raises:
        TokenizerRecordError: the message names the file, what is wrong with it and what
            to do.
    """
    path = record_path(prefix)
    if not os.path.lexists(path):
        return None

    def refuse(what: str) -> TokenizerRecordError:
        return TokenizerRecordError(f"{path}: {what}; {_FIX}")

    if path.is_symlink() and not path.exists():
        raise refuse(f"a symbolic link to {os.readlink(path)}, which does not exist")
    if path.is_dir():
        raise refuse("a directory, not a tokenizer record file")
    if not path.is_file():
        raise refuse("not a regular file (a tokenizer record is a small JSON file)")
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    if not data.strip():
        raise refuse("empty, not a tokenizer record")
    if len(data) > MAX_RECORD_BYTES:
        raise refuse(f"over {MAX_RECORD_BYTES:,} bytes, not a tokenizer record")
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise refuse(f"not a tokenizer record: not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise refuse(f"not a tokenizer record: a JSON {type(record).__name__}, not an object")
    if "format" in record and record["format"] != FORMAT:
        raise TokenizerRecordError(
            f"{path}: tokenizer record format {record['format']!r}; this epochal reads "
            f"{FORMAT}: preprocess the corpus again with this epochal, or use the epochal "
            "that wrote it"
        )
    problem = _field_problem(record)
    if problem:
        raise refuse(f"not a tokenizer record: {problem}")
    return record


def _field_problem(record: dict[str, Any]) -> str | None:
    """What is wrong with a record's fields (first problem found), or None."""
    for name in ("format", "tokenizer_type", "fingerprint", "vocab_size"):
        if name not in record:
            return f"no {name!r} field"
    kind = record["tokenizer_type"]
    if not isinstance(kind, str) or canonical_tokenizer_type(kind) is None:
        return f"tokenizer_type {kind!r} is not a tokenizer epochal knows"
    fingerprint = record["fingerprint"]
    if not (
        isinstance(fingerprint, str)
        and len(fingerprint) == 64
        and all(c in "0123456789abcdef" for c in fingerprint)
    ):
        return f"fingerprint {fingerprint!r} is not a SHA-256 (64 hex digits)"
    if not is_int(record["vocab_size"]) or record["vocab_size"] < 1:
        return f"vocab_size {record['vocab_size']!r} is not a positive integer"
    eod = record.get("eod")
    if eod is not None and (not is_int(eod) or not 0 <= eod < record["vocab_size"]):
        return f"eod {eod!r} is not an id below vocab_size {record['vocab_size']}"
    for name in OPTIONS:
        value = record.get(name)
        if name == "vocab_extra_ids":
            if value is not None and (not is_int(value) or value < 0):
                return f"vocab_extra_ids {value!r} is not a non-negative integer"
        elif value is not None and not isinstance(value, str):
            return f"{name} {value!r} is not a string or null"
    return None
