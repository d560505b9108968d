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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROLES",
    "SFTDataError",
    "SFTRow",
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
    """A fine-tuning file or row that cannot be used; the message names the file and row."""


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
        FileNotFoundError: ``path`` does not exist.
        SFTDataError: an unknown file type, a line that is not JSON, a row that is not
            an object, a row with neither ``messages`` nor ``prompt`` + ``completion``,
            an unknown role, a message without string ``content``, an empty completion
            or assistant turn, rows of different formats in one file, an empty file,
            or a missing split. The message names the file and row.
        ImportError: a Parquet file without ``pyarrow``, a folder without ``datasets``.
    """
    source = os.fspath(path)
    if not os.path.exists(source):
        raise FileNotFoundError(f"fine-tuning data {source!r} does not exist")
    if split is not None and not os.path.isdir(source):
        raise SFTDataError(f"{source}: split={split!r} applies only to save_to_disk folders")
    if os.path.isdir(source):
        records = _folder_records(source, split)
    elif source.endswith(".parquet"):
        records = _parquet_records(source)
    elif source.endswith((".jsonl", ".json")):
        records = _json_records(source)
    else:
        raise SFTDataError(
            f"{source}: unknown fine-tuning file type; use .jsonl, .json, .parquet or a "
            "save_to_disk folder"
        )
    rows = rows_from_records(records, source=source)
    if not rows:
        raise SFTDataError(f"{source}: no rows")
    return rows


def rows_from_records(records: Iterable[tuple[int | None, Any]], *, source: str) -> list[SFTRow]:
    """Validate records (``(line or None, dict)`` pairs) into :class:`SFTRow` objects.

    Args:
        records: each record's 1-based line (JSONL) or ``None``, and the decoded row.
        source: the file name used in error messages.

    Returns:
        One row per record, in order.

    Raises:
        SFTDataError: as :func:`read_sft_rows`, naming ``source`` and the row.
    """
    rows: list[SFTRow] = []
    for index, (line, record) in enumerate(records):
        row = _validate(record, source, index, line)
        if rows and row.kind != rows[0].kind:
            raise SFTDataError(
                f"{row.where}: a {row.kind!r} row in a file of {rows[0].kind!r} rows "
                f"(from {rows[0].where}); put each format in its own file"
            )
        rows.append(row)
    return rows


def _where(source: str, index: int, line: int | None) -> str:
    text = f"{source} row {index}"
    return text if line is None else f"{text} (line {line})"


def _validate(record: Any, source: str, index: int, line: int | None) -> SFTRow:
    where = _where(source, index, line)
    if not isinstance(record, Mapping):
        raise SFTDataError(f"{where}: a row must be an object, got {type(record).__name__}")
    messages = record.get("messages")
    prompt = record.get("prompt")
    completion = record.get("completion")
    if messages is not None:
        if prompt is not None or completion is not None:
            raise SFTDataError(
                f"{where}: has both 'messages' and 'prompt'/'completion'; keep one format"
            )
        conversation = _messages(messages, where, "messages")
        for number, message in enumerate(conversation):
            if message["role"] == "assistant" and not message["content"].strip():
                raise SFTDataError(f"{where}: messages[{number}] is an empty assistant turn")
        return SFTRow(source, index, line, messages=conversation)
    if prompt is None or completion is None:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise SFTDataError(
            f"{where}: a row needs 'messages', or 'prompt' and 'completion' (its keys: {keys})"
        )
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion.strip():
            raise SFTDataError(f"{where}: empty completion")
        return SFTRow(source, index, line, prompt=prompt, completion=completion)
    if isinstance(prompt, str) or isinstance(completion, str):
        raise SFTDataError(
            f"{where}: 'prompt' and 'completion' must both be strings or both be message "
            f"lists, got {type(prompt).__name__} and {type(completion).__name__}"
        )
    prompt_messages = _messages(prompt, where, "prompt")
    completion_messages = _messages(completion, where, "completion")
    if not any(m["content"].strip() for m in completion_messages):
        raise SFTDataError(f"{where}: empty completion")
    return SFTRow(source, index, line, prompt=prompt_messages, completion=completion_messages)


def _messages(value: Any, where: str, key: str) -> tuple[dict[str, str], ...]:
    if not isinstance(value, list | tuple) or not value:
        raise SFTDataError(f"{where}: {key!r} must be a non-empty list of messages")
    out = []
    for number, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise SFTDataError(f"{where}: {key}[{number}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise SFTDataError(
                f"{where}: {key}[{number}] has unknown role {role!r}; roles are {', '.join(ROLES)}"
            )
        content = message.get("content")
        if not isinstance(content, str):
            raise SFTDataError(
                f"{where}: {key}[{number}] content must be a string, got {type(content).__name__}"
            )
        out.append({"role": role, "content": content})
    return tuple(out)


def _json_records(path: str) -> Iterator[tuple[int | None, Any]]:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SFTDataError(f"{path}: not valid JSON ({exc})") from None
        return ((None, value) for value in values)
    return _json_lines(path, text)


def _json_lines(path: str, text: str) -> Iterator[tuple[int | None, Any]]:
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SFTDataError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
        yield number, value


def _parquet_records(path: str) -> Iterator[tuple[int | None, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is a dependency of the sft extra
        raise ImportError(f"reading {path} needs pyarrow: pip install 'epochal[sft]'") from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses
        raise SFTDataError(f"{path}: not a readable Parquet file ({exc})") from None
    return ((None, row) for row in table.to_pylist())


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
        raise SFTDataError(f"{path}: not a datasets save_to_disk folder ({exc})") from None
    if isinstance(data, datasets.DatasetDict):
        names = list(data)
        if split is None:
            split = names[0] if len(names) == 1 else "train"
        if split not in data:
            raise SFTDataError(
                f"{path}: no split {split!r}; the folder has {', '.join(names)} (set split)"
            )
        data = data[split]
    elif split is not None:
        raise SFTDataError(f"{path}: split={split!r} given, but the folder holds one Dataset")
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
