"""Supervised fine-tuning rows as users have them: JSONL, Parquet or ``save_to_disk`` folders.

A row is one training example in one of the dataset formats TRL documents:

- **conversational**: ``{"messages": [{"role": ..., "content": ...}, ...]}``, roles
  ``system``, ``user`` and ``assistant``;
- **prompt-completion**: ``{"prompt": str, "completion": str}``;
- **conversational prompt-completion**: ``{"prompt": [messages], "completion": [messages]}``.

Other columns (``id``, ``source``, ...) are ignored, and so are message keys other
than ``role`` and ``content`` (``name``, ``tool_calls``: tool use is not supported). Every row of one file has the
same format (a row in another format is an error naming it), because the format
decides which tokens carry the loss (see :mod:`epochal.data.sft.tokenize`).

:func:`read_sft_rows` returns the rows in file order, every time and in every process:
nothing is shuffled or sampled here. Each row remembers its file and row number, so
every later error (a template that does not render, a row over the length limit)
names both.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROLES",
    "SFTDataError",
    "SFTRow",
    "check_rows_path",
    "iter_sft_rows",
    "read_sft_rows",
    "rows_from_records",
    "split_sft_rows",
]

#: the message roles a row may use
ROLES = ("system", "user", "assistant")

#: row formats (:attr:`SFTRow.kind`)
MESSAGES = "messages"
PROMPT_COMPLETION = "prompt_completion"
CONVERSATIONAL_PROMPT_COMPLETION = "conversational_prompt_completion"


class SFTDataError(ValueError):
    """A fine-tuning file or row that cannot be used; the message names the file and row.

    Attributes:
        source: the file (or folder) at fault, when the error is about one; callers use
            it to name the option that gave the file.
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.source = source


@dataclass(frozen=True)
class SFTRow:
    """One validated row.

    Attributes:
        source: the file (or folder) the row comes from.
        index: the row's 0-based position in that file (blank JSONL lines not counted).
        line: the 1-based line of a JSONL file, else ``None``.
        messages: the conversation (``messages`` format), else ``None``.
        prompt / completion: a string each, or a list of messages each, else ``None``.
    """

    source: str
    index: int
    line: int | None
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | tuple[dict[str, str], ...] | None = None
    completion: str | tuple[dict[str, str], ...] | None = None

    @property
    def kind(self) -> str:
        """``"messages"``, ``"prompt_completion"`` or ``"conversational_prompt_completion"``."""
        if self.messages is not None:
            return MESSAGES
        if isinstance(self.prompt, str):
            return PROMPT_COMPLETION
        return CONVERSATIONAL_PROMPT_COMPLETION

    @property
    def where(self) -> str:
        """``"FILE row N"`` (and ``"(line L)"`` for JSONL), for error messages."""
        text = f"{self.source} row {self.index}"
        return text if self.line is None else f"{text} (line {self.line})"


def read_sft_rows(path: str | os.PathLike, *, split: str | None = None) -> list[SFTRow]:
    """Read and validate every row of a fine-tuning file, in file order.

    The list of :func:`iter_sft_rows` (which reads one row at a time).

    Args:
        path: a ``.jsonl`` file (one JSON object a line; blank lines skipped), a
            ``.json`` file (a JSON array of objects, or JSON lines), a ``.parquet``
            file, or a folder written by ``datasets``' ``save_to_disk`` (a
            ``Dataset``, or a ``DatasetDict`` with ``split`` naming one of its splits).
        split: the split of a ``DatasetDict`` folder (default: its only split, or
            ``"train"``). Not allowed for files.

    Returns:
        The rows, ``len == number of rows in the file``.

    Raises:
        As :func:`iter_sft_rows`.
    """
    return list(iter_sft_rows(path, split=split))


def check_rows_path(path: str | os.PathLike) -> str:
    """``path`` as a string, if it is a regular file or a folder (symbolic links followed).

    Checked before anything opens it: opening a named pipe blocks until something
    writes to it, and a device never ends.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SFTDataError: ``path`` is a named pipe, a socket or a device (names it).
    """
    source = os.fspath(path)
    try:
        mode = os.stat(source).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"fine-tuning data {source!r} does not exist") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return source
    kinds = ((stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device"))
    kind = next((name for test, name in kinds if test(mode)), "special file")
    raise SFTDataError(
        f"{source}: a {kind}, not a regular file or a folder; fine-tuning rows are read "
        "from a .jsonl, .json or .parquet file or a save_to_disk folder: write the rows "
        "to a file and give its path",
        source=source,
    )


def iter_sft_rows(path: str | os.PathLike, *, split: str | None = None) -> Iterator[SFTRow]:
    """Yield the validated rows of a fine-tuning file in file order, one at a time.

    JSONL (and JSON-lines ``.json``) files are read line by line, Parquet files in
    record batches and ``save_to_disk`` folders row by row, so memory does not grow
    with the file (a ``.json`` array is parsed whole). A JSONL line ends at ``\n``
    only (as ``datasets`` and ``json.loads`` read it): a raw U+2028, U+2029 or U+0085
    inside a string is part of the string, and line numbers count ``\n``.

    Args / file types: as :func:`read_sft_rows`.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        SFTDataError: a path that is not a regular file or folder, an unknown file
            type, a line that is not UTF-8 or not JSON (or nested too deep to read),
            a row that is not an object, a row with neither ``messages`` nor
            ``prompt`` + ``completion``, an unknown role, a message without string
            ``content``, text that is not valid Unicode (a lone surrogate), an empty
            completion or assistant turn, rows of different formats in one file, an
            empty file, or a missing split. The message names the file and row (and
            the line of a JSONL file); ``SFTDataError.source`` is the file.
        ImportError: a Parquet file without ``pyarrow``, a folder without ``datasets``.
    """
    source = check_rows_path(path)
    if split is not None and not os.path.isdir(source):
        raise SFTDataError(
            f"{source}: split={split!r} applies only to save_to_disk folders", source=source
        )
    if os.path.isdir(source):
        records = _folder_records(source, split)
    elif source.endswith(".parquet"):
        records = _parquet_records(source)
    elif source.endswith((".jsonl", ".json")):
        records = _json_records(source)
    else:
        raise SFTDataError(
            f"{source}: unknown fine-tuning file type; use .jsonl, .json, .parquet or a "
            "save_to_disk folder",
            source=source,
        )
    empty = True
    for row in _rows(records, source):
        empty = False
        yield row
    if empty:
        raise SFTDataError(f"{source}: no rows", source=source)


def rows_from_records(records: Iterable[tuple[int | None, Any]], *, source: str) -> list[SFTRow]:
    """Validate records (``(line or None, dict)`` pairs) into :class:`SFTRow` objects.

    Args:
        records: each record's 1-based line (JSONL) or ``None``, and the decoded row.
        source: the file name used in error messages.

    Returns:
        One row per record, in order.

    Raises:
        SFTDataError: as :func:`iter_sft_rows`, naming ``source`` and the row.
    """
    return list(_rows(records, source))


def _rows(records: Iterable[tuple[int | None, Any]], source: str) -> Iterator[SFTRow]:
    first: SFTRow | None = None
    for index, (line, record) in enumerate(records):
        row = _validate(record, source, index, line)
        if first is None:
            first = row
        elif row.kind != first.kind:
            raise SFTDataError(
                f"{row.where}: a {row.kind!r} row in a file of {first.kind!r} rows "
                f"(from {first.where}); put each format in its own file",
                source=source,
            )
        yield row


def _where(source: str, index: int, line: int | None) -> str:
    text = f"{source} row {index}"
    return text if line is None else f"{text} (line {line})"


def _validate(record: Any, source: str, index: int, line: int | None) -> SFTRow:
    where = _where(source, index, line)

    def fail(message: str) -> SFTDataError:
        return SFTDataError(f"{where}: {message}", source=source)

    if not isinstance(record, Mapping):
        raise fail(f"a row must be an object, got {type(record).__name__}")
    messages = record.get("messages")
    prompt = record.get("prompt")
    completion = record.get("completion")
    if messages is not None:
        if prompt is not None or completion is not None:
            raise fail("has both 'messages' and 'prompt'/'completion'; keep one format")
        conversation = _messages(messages, "messages", fail)
        for number, message in enumerate(conversation):
            if message["role"] == "assistant" and not message["content"].strip():
                raise fail(f"messages[{number}] is an empty assistant turn")
        return SFTRow(source, index, line, messages=conversation)
    if prompt is None or completion is None:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise fail(f"a row needs 'messages', or 'prompt' and 'completion' (its keys: {keys})")
    if isinstance(prompt, str) and isinstance(completion, str):
        _check_text(prompt, "prompt", fail)
        _check_text(completion, "completion", fail)
        if not completion.strip():
            raise fail("empty completion")
        return SFTRow(source, index, line, prompt=prompt, completion=completion)
    if isinstance(prompt, str) or isinstance(completion, str):
        raise fail(
            "'prompt' and 'completion' must both be strings or both be message lists, got "
            f"{type(prompt).__name__} and {type(completion).__name__}"
        )
    prompt_messages = _messages(prompt, "prompt", fail)
    completion_messages = _messages(completion, "completion", fail)
    if not any(m["content"].strip() for m in completion_messages):
        raise fail("empty completion")
    return SFTRow(source, index, line, prompt=prompt_messages, completion=completion_messages)


def _messages(value: Any, key: str, fail: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list | tuple) or not value:
        raise fail(f"{key!r} must be a non-empty list of messages")
    out = []
    for number, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise fail(f"{key}[{number}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise fail(f"{key}[{number}] has unknown role {role!r}; roles are {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            raise fail(f"{key}[{number}] content must be a string, got {type(content).__name__}")
        _check_text(content, f"{key}[{number}] content", fail)
        out.append({"role": role, "content": content})
    return tuple(out)


def _check_text(text: str, what: str, fail: Any) -> None:
    """Refuse a string that is not Unicode text: a lone surrogate (from a ``\ud800`` escape)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        at = exc.start
        near = text[max(0, at - 20) : at + 20]
        raise fail(
            f"{what} holds the lone surrogate U+{ord(text[at]):04X} at character {at} "
            f"({near!r}): not Unicode text (a JSON \\u escape of half a surrogate pair); "
            "fix the text, e.g. write the character itself or both halves of its pair"
        ) from None


def _loads(text: str | bytes, where: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SFTDataError(
            f"{where}: not valid JSON ({exc.msg}, column {exc.colno}); each line of a JSONL "
            "file is one JSON object (one row): fix or remove the line",
            source=source,
        ) from None
    except RecursionError:
        raise SFTDataError(
            f"{where}: JSON nested too deeply to read (arrays or objects inside each other "
            "thousands of levels deep); a row is an object with 'messages', or 'prompt' and "
            "'completion'",
            source=source,
        ) from None


#: JSON's whitespace (RFC 8259): a line of only these is blank
_JSON_SPACE = b" \t\r\n"


def _json_records(path: str) -> Iterator[tuple[int | None, Any]]:
    if path.endswith(".json") and _first_byte(path) == b"[":
        with open(path, "rb") as handle:
            data = handle.read()
        text = _utf8(data.removeprefix(b"\xef\xbb\xbf"), path, None)
        values = _loads(text, path, path)
        if not isinstance(values, list):  # pragma: no cover - starts with "[": a list
            raise SFTDataError(f"{path}: expected a JSON array of rows", source=path)
        return ((None, value) for value in values)
    return _json_lines(path)


def _first_byte(path: str) -> bytes:
    """The first byte that is not JSON whitespace (after a UTF-8 byte-order mark), or b""."""
    with open(path, "rb") as handle:
        start = True
        while chunk := handle.read(1 << 16):
            if start:
                chunk, start = chunk.removeprefix(b"\xef\xbb\xbf"), False
            stripped = chunk.lstrip(_JSON_SPACE)
            if stripped:
                return stripped[:1]
    return b""


def _utf8(data: bytes, path: str, line: int | None) -> str:
    b_newline = b"\n"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if line is None:  # a whole file: say where the byte is
            where = f"{path} line {data.count(b_newline, 0, exc.start) + 1}"
        else:
            where = f"{path} line {line} column {exc.start + 1}"
        raise SFTDataError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8",
            source=path,
        ) from None


def _json_lines(path: str) -> Iterator[tuple[int | None, Any]]:
    """``(line, value)`` of each non-blank line; a line ends at ``\\n`` only."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):  # binary lines split at b"\n" only
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if not raw.strip(_JSON_SPACE):
                continue
            text = _utf8(raw, path, number)
            yield number, _loads(text, f"{path} line {number}", path)


def _parquet_records(path: str) -> Iterator[tuple[int | None, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency of the sft extra
        raise ImportError(f"reading {path} needs pyarrow: pip install 'epochal[sft]'") from exc
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise SFTDataError(f"{path}: not a readable Parquet file ({exc})", source=path) from None
    return _parquet_rows(table, path)


def _parquet_rows(table: Any, path: str) -> Iterator[tuple[int | None, Any]]:
    try:
        for batch in table.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield None, row
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
        raise SFTDataError(f"{path}: not a readable Parquet file ({exc})", source=path) from None


def _folder_records(path: str, split: str | None) -> Iterator[tuple[int | None, Any]]:
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - datasets is a dependency of the sft extra
        raise ImportError(
            f"reading the save_to_disk folder {path} needs datasets: pip install 'epochal[sft]'"
        ) from exc
    try:
        data = datasets.load_from_disk(path)
    except Exception as exc:  # FileNotFoundError / ValueError from datasets
        raise SFTDataError(
            f"{path}: not a datasets save_to_disk folder ({exc})", source=path
        ) from None
    if isinstance(data, datasets.DatasetDict):
        names = list(data)
        if split is None:
            split = names[0] if len(names) == 1 else "train"
        if split not in data:
            raise SFTDataError(
                f"{path}: no split {split!r}; the folder has {', '.join(names)} (set split)",
                source=path,
            )
        data = data[split]
    elif split is not None:
        raise SFTDataError(
            f"{path}: split={split!r} given, but the folder holds one Dataset", source=path
        )
    return ((None, row) for row in data)


def split_sft_rows(
    rows: list[SFTRow], split: str
) -> tuple[list[SFTRow], list[SFTRow], list[SFTRow]]:
    """Train / validation / test rows of one file by a Megatron split string.

    ``"98,2"`` gives the first 98% of the rows (in file order) to training and the
    rest to validation, with Megatron-Core's ranges
    (:func:`~epochal.data.datasets.splits.split_document_ranges`): contiguous, the
    same in every process, every row in exactly one part.

    Args:
        rows: the file's rows.
        split: one to three non-negative weights, e.g. ``"98,2"`` or ``"90,5,5"``.

    Returns:
        ``(train, valid, test)``; an absent part is empty.

    Raises:
        ValueError: an invalid split string.
    """
    from epochal.data.datasets.splits import split_document_ranges

    parts = []
    for bounds in split_document_ranges(split, len(rows)):
        parts.append([] if bounds is None else rows[bounds[0] : bounds[1]])
    return parts[0], parts[1], parts[2]
