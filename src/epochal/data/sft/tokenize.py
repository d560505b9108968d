"""Fine-tuning rows to token ids and loss masks, exactly as TRL's ``SFTTrainer`` prepares them.

For every :class:`~epochal.data.sft.rows.SFTRow`, :func:`tokenize_sft_rows` gives
``input_ids`` and a ``loss_mask`` of the same length, where ``loss_mask[i]`` says
whether token ``i`` is a training target (TRL's ``labels[i] != -100``; the model
predicts token ``i`` from the tokens before it, so ``loss_mask[0]`` never counts, see
:mod:`epochal.data.sft.loss`). The rules are TRL's (``trl/trainer/sft_trainer.py``,
``SFTTrainer._prepare_dataset``):

- **prompt-completion** (strings): the EOS token is appended to the completion
  (unless it already ends with it); ``input_ids = tokenizer(prompt + completion)``
  (with the tokenizer's special tokens, e.g. a BOS); the completion starts after the
  longest common prefix of ``tokenizer(prompt)`` and that, which is
  ``len(tokenizer(prompt))`` unless tokens merge across the boundary.
  ``loss_on="completion"`` masks the prompt (TRL's ``completion_only_loss``).
- **conversational prompt-completion**: the same with the chat template
  (``apply_chat_template(prompt, add_generation_prompt=True)`` for the prompt,
  ``apply_chat_template(prompt + completion)`` for the whole); no EOS is appended
  (the template ends the turn).
- **messages**: ``apply_chat_template(messages)``; ``loss_on="completion"`` trains on
  the assistant turns, which the template marks with ``{% generation %}`` ...
  ``{% endgeneration %}`` (TRL's ``assistant_only_loss``, transformers'
  ``return_assistant_tokens_mask``). For a template without these markers (Llama 3's,
  Qwen2.5's, Mistral's as shipped) the assistant turns are found by rendering the
  conversation's prefixes: turn ``k`` is what ``render(messages[:k + 1])`` adds to
  ``render(messages[:k], add_generation_prompt=True)``, i.e. what the model generates
  after the generation prompt, end-of-turn tokens included. This needs a template
  that renders a conversation's start as the start of the whole (an error naming the
  row otherwise: add the markers, or use ``loss_on="all"``), and the report counts the
  rows masked so. TRL instead swaps in its own marked copy of a few known templates:
  for Llama 3's the masks are the same; Qwen2.5's marked copy also trains the newline
  after ``assistant`` that the generation prompt already holds.
- ``loss_on="all"``: every token is a target (TRL's default for ``messages`` rows).

Rows longer than ``max_length`` tokens are an error by default; ``overlength="skip"``
leaves them out and ``"truncate"`` keeps their first ``max_length`` tokens (TRL's
``truncation_mode="keep_start"``), dropping a row left without loss tokens as TRL
does. Both are counted in the :class:`SFTReport`, never silent.

The tokenizer is a Hugging Face ``transformers`` tokenizer (``AutoTokenizer`` of a
model folder: its ``tokenizer_config.json`` holds the chat template); the result is
a pure function of the rows and the tokenizer, the same in every process.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from epochal._text import plural
from epochal.data.sft.rows import (
    CONVERSATIONAL_PROMPT_COMPLETION,
    MESSAGES,
    PROMPT_COMPLETION,
    SFTDataError,
    SFTRow,
)
from epochal.data.sft.tokenizer_folder import check_chat_template, check_tokenizer_folder

__all__ = [
    "DROPPED",
    "KEPT",
    "LOSS_ON",
    "OVERLENGTH",
    "SKIPPED",
    "TRUNCATED",
    "LimitedRow",
    "SFTExample",
    "SFTReport",
    "SFTTokenized",
    "check_tokenize_options",
    "has_generation_markers",
    "limited_rows",
    "load_chat_tokenizer",
    "tokenize_sft_row",
    "tokenize_sft_rows",
]

#: ``loss_on`` values: the completion / assistant turns, or every token
LOSS_ON = ("completion", "all")
#: ``overlength`` values: what to do with a row longer than ``max_length``
OVERLENGTH = ("error", "skip", "truncate")

_GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass(frozen=True)
class SFTExample:
    """One tokenized row.

    Attributes:
        input_ids: int64 ``[L]``.
        loss_mask: bool ``[L]``; ``True`` where the token is a training target.
        source / index: the row's file and 0-based row number.
        truncated: tokens cut off the end (``overlength="truncate"``), else 0.
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    source: str
    index: int
    truncated: int = 0

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        """Targets the loss counts: ``loss_mask[1:].sum()`` (token 0 is never predicted)."""
        return int(self.loss_mask[1:].sum())


@dataclass(frozen=True)
class SFTReport:
    """What tokenization kept, skipped and cut (all counts; tokens after truncation).

    Attributes:
        rows: rows read.
        examples: rows kept.
        skipped: rows over ``max_length`` left out (``overlength="skip"``).
        truncated: kept rows cut to ``max_length`` (``overlength="truncate"``).
        truncated_tokens: tokens cut off those rows.
        dropped_no_loss: truncated rows left without a loss token, dropped as TRL does.
        tokens: tokens of the kept rows.
        loss_tokens: their training targets (``sum(loss_mask[1:])`` over the rows).
        max_length: the limit, or ``None``.
        prefix_masked: kept ``messages`` rows whose assistant turns were found by
            rendering prefixes (a template without generation markers).
    """

    rows: int
    examples: int
    skipped: int
    truncated: int
    truncated_tokens: int
    dropped_no_loss: int
    tokens: int
    loss_tokens: int
    max_length: int | None
    prefix_masked: int = 0

    def summary(self) -> str:
        """One line, e.g. ``"100 rows -> 98 examples (2 over 512 tokens skipped), ..."``."""
        parts = [
            f"{plural(self.rows, 'row', fmt=',')} -> {plural(self.examples, 'example', fmt=',')}"
        ]
        if self.skipped:
            parts.append(f"{self.skipped:,} over {self.max_length:,} tokens skipped")
        if self.truncated:
            parts.append(
                f"{self.truncated:,} truncated to {self.max_length:,} tokens "
                f"({self.truncated_tokens:,} tokens cut)"
            )
        if self.dropped_no_loss:
            parts.append(f"{self.dropped_no_loss:,} left without loss tokens by truncation dropped")
        if self.prefix_masked:
            parts.append(
                f"assistant turns of {plural(self.prefix_masked, 'row', fmt=',')} found by rendering prefixes "
                "(the chat template has no generation markers)"
            )
        tokens = plural(self.tokens, "token", fmt=",")
        parts.append(f"{tokens}, {plural(self.loss_tokens, 'loss token', fmt=',')}")
        return ", ".join(parts)


@dataclass(frozen=True)
class SFTTokenized:
    """The examples of :func:`tokenize_sft_rows` (in row order) and its :class:`SFTReport`."""

    examples: list[SFTExample]
    report: SFTReport

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> SFTExample:
        return self.examples[index]


def has_generation_markers(chat_template: str | dict[str, str] | None) -> bool:
    """Whether a chat template marks assistant turns with ``{% generation %}`` (any trim form).

    A template given as named variants is judged by its ``"default"`` one, as TRL does.
    """
    if isinstance(chat_template, dict):
        chat_template = chat_template.get("default")
    return bool(chat_template) and _GENERATION.search(chat_template) is not None


def load_chat_tokenizer(path: str | os.PathLike) -> Any:
    """``transformers.AutoTokenizer`` of a Hugging Face model or tokenizer folder (offline).

    The folder is checked first (:func:`~epochal.data.sft.tokenizer_folder.check_tokenizer_folder`:
    no custom code, a chat template that is text) and loaded with
    ``trust_remote_code=False``, so no file of the folder is ever run and no question
    is asked.

    Raises:
        ImportError: ``transformers`` is not installed.
        SFTDataError: the folder names custom code in an ``auto_map`` entry, has a
            ``chat_template`` that is not a string, or has no loadable tokenizer (the
            message names the file).
    """
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - transformers is in the sft extra
        raise ImportError("chat templates need transformers: pip install 'epochal[sft]'") from exc
    folder = os.fspath(path)
    check_tokenizer_folder(folder)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:  # OSError / ValueError from transformers
        raise SFTDataError(f"{folder}: no loadable tokenizer ({exc})", source=folder) from None
    check_chat_template(getattr(tokenizer, "chat_template", None), folder)
    return tokenizer


def tokenize_sft_rows(
    rows: Iterable[SFTRow],
    tokenizer: Any,
    *,
    max_length: int | None = None,
    loss_on: str = "completion",
    overlength: str = "error",
) -> SFTTokenized:
    """Tokenize rows into ids and loss masks equal to TRL's (see the module docstring).

    Args:
        rows: rows from :func:`~epochal.data.sft.rows.read_sft_rows`.
        tokenizer: a ``transformers`` tokenizer (fast, for ``messages`` with
            ``loss_on="completion"``), with a chat template for conversational rows
            and an EOS token for prompt-completion strings.
        max_length: the longest row in tokens (the sequence length), or ``None``.
        loss_on: ``"completion"`` or ``"all"``.
        overlength: ``"error"``, ``"skip"`` or ``"truncate"`` for rows over ``max_length``.

    Returns:
        :class:`SFTTokenized`: the kept rows' examples in row order and the report.

    Raises:
        ValueError: an invalid ``loss_on``, ``overlength`` or ``max_length``.
        SFTDataError: a row over ``max_length`` (``overlength="error"``), a template
            that does not render a row, a ``messages`` row without assistant tokens,
            a template without generation markers that does not render the start of a
            conversation as the start of the whole (``loss_on="completion"``), a
            tokenizer without chat template or EOS token, or one whose chat template is
            not a string; the message names the file and row and the fix.
    """
    examples: list[SFTExample] = []
    counts = dict(rows=0, skipped=0, truncated=0, truncated_tokens=0, dropped=0, prefix=0)
    for limited in limited_rows(
        rows, tokenizer, max_length=max_length, loss_on=loss_on, overlength=overlength
    ):
        counts["rows"] += 1
        counts["skipped"] += limited.status == SKIPPED
        counts["truncated"] += limited.status in (TRUNCATED, DROPPED)
        counts["truncated_tokens"] += limited.cut
        counts["dropped"] += limited.status == DROPPED
        if limited.example is not None:
            examples.append(limited.example)
            counts["prefix"] += limited.prefix_masked
    report = SFTReport(
        rows=counts["rows"],
        examples=len(examples),
        skipped=counts["skipped"],
        truncated=counts["truncated"],
        truncated_tokens=counts["truncated_tokens"],
        dropped_no_loss=counts["dropped"],
        tokens=sum(len(e) for e in examples),
        loss_tokens=sum(e.num_loss_tokens for e in examples),
        max_length=max_length,
        prefix_masked=counts["prefix"],
    )
    return SFTTokenized(examples, report)


#: :attr:`LimitedRow.status`: kept whole, kept cut to ``max_length``, left out as too
#: long, cut and then dropped for having no loss token left
KEPT, TRUNCATED, SKIPPED, DROPPED = 0, 1, 2, 3


@dataclass(frozen=True)
class LimitedRow:
    """One row through :func:`limited_rows`: what the length limit made of it.

    Attributes:
        row: the row.
        status: :data:`KEPT`, :data:`TRUNCATED`, :data:`SKIPPED` or :data:`DROPPED`.
        cut: tokens cut off its end (``TRUNCATED`` / ``DROPPED``), else 0.
        example: the kept example (``KEPT`` / ``TRUNCATED``), else ``None``.
        prefix_masked: a kept ``messages`` row whose assistant turns were found by
            rendering prefixes (a template without generation markers).
    """

    row: SFTRow
    status: int
    cut: int = 0
    example: SFTExample | None = None
    prefix_masked: bool = False


def check_tokenize_options(loss_on: str, overlength: str, max_length: int | None) -> None:
    """Raise ``ValueError`` naming an invalid ``loss_on``, ``overlength`` or ``max_length``."""
    if loss_on not in LOSS_ON:
        raise ValueError(f"loss_on must be one of {', '.join(LOSS_ON)}, got {loss_on!r}")
    if overlength not in OVERLENGTH:
        raise ValueError(f"overlength must be one of {', '.join(OVERLENGTH)}, got {overlength!r}")
    if max_length is not None and (isinstance(max_length, bool) or max_length < 1):
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")


def limited_rows(
    rows: Iterable[SFTRow],
    tokenizer: Any,
    *,
    max_length: int | None = None,
    loss_on: str = "completion",
    overlength: str = "error",
) -> Iterator[LimitedRow]:
    """Tokenize rows one at a time and apply the length limit (the rules of :func:`tokenize_sft_rows`).

    Yields:
        One :class:`LimitedRow` per row, in order (skipped and dropped rows included).

    Raises:
        As :func:`tokenize_sft_rows`.
    """
    check_tokenize_options(loss_on, overlength, max_length)
    check_chat_template(getattr(tokenizer, "chat_template", None), "the tokenizer")
    by_prefix = loss_on == "completion" and not has_generation_markers(
        getattr(tokenizer, "chat_template", None)
    )
    for row in rows:
        ids, mask = tokenize_sft_row(row, tokenizer, loss_on=loss_on)
        status, cut = KEPT, 0
        if max_length is not None and ids.shape[0] > max_length:
            if overlength == "error":
                raise SFTDataError(
                    f"{row.where}: {ids.shape[0]} tokens, over the length limit of "
                    f"{max_length}; shorten the row, raise the sequence length, or set "
                    "overlength to 'skip' or 'truncate'",
                    source=row.source,
                )
            if overlength == "skip":
                yield LimitedRow(row, SKIPPED)
                continue
            cut = int(ids.shape[0]) - max_length
            ids, mask = ids[:max_length], mask[:max_length]
            status = TRUNCATED
            if not mask.any():
                yield LimitedRow(row, DROPPED, cut)
                continue
        example = SFTExample(ids, mask, row.source, row.index, cut)
        yield LimitedRow(row, status, cut, example, by_prefix and row.kind == MESSAGES)


def tokenize_sft_row(
    row: SFTRow, tokenizer: Any, *, loss_on: str = "completion"
) -> tuple[np.ndarray, np.ndarray]:
    """One row's ``(input_ids int64 [L], loss_mask bool [L])``, untruncated.

    Raises:
        SFTDataError: as :func:`tokenize_sft_rows` (except the length limit).
    """
    kind = row.kind
    if kind == PROMPT_COMPLETION:
        eos = getattr(tokenizer, "eos_token", None)
        if not eos:
            raise SFTDataError(
                f"{row.where}: the tokenizer has no EOS token to end the completion; set "
                "eos_token in its tokenizer_config.json"
            )
        completion = row.completion if row.completion.endswith(eos) else row.completion + eos
        prompt_ids = _encode(tokenizer, row.prompt, row)
        ids = _encode(tokenizer, row.prompt + completion, row)
        return _completion_masked(prompt_ids, ids, loss_on)
    _check_template(tokenizer, row)
    if kind == CONVERSATIONAL_PROMPT_COMPLETION:
        prompt_ids = _render(tokenizer, list(row.prompt), row, add_generation_prompt=True)[
            "input_ids"
        ]
        ids = _render(tokenizer, list(row.prompt) + list(row.completion), row)["input_ids"]
        return _completion_masked(prompt_ids, ids, loss_on)
    assert kind == MESSAGES
    if loss_on == "all":
        ids = _render(tokenizer, list(row.messages), row)["input_ids"]
        return _ids(ids), np.ones(len(ids), dtype=bool)
    if not has_generation_markers(tokenizer.chat_template):
        return _assistant_turns_by_prefix(tokenizer, row)
    out = _render(tokenizer, list(row.messages), row, return_assistant_tokens_mask=True)
    mask = np.asarray(out["assistant_masks"], dtype=bool)
    if not mask.any():
        raise SFTDataError(
            f"{row.where}: the chat template marks no assistant tokens in this row (it needs an "
            "assistant turn inside {% generation %} ... {% endgeneration %})"
        )
    return _ids(out["input_ids"]), mask


def _assistant_turns_by_prefix(tokenizer: Any, row: SFTRow) -> tuple[np.ndarray, np.ndarray]:
    """Assistant masks of a template without generation markers, from rendered prefixes.

    Turn ``k`` (an assistant message) spans from the end of
    ``render(messages[:k], add_generation_prompt=True)`` (the common prefix with the
    next rendering, as TRL finds a completion) to the end of
    ``render(messages[:k + 1])``: what the model generates after the generation
    prompt, the end-of-turn tokens included.
    """
    messages = list(row.messages)
    full = _ids(_render(tokenizer, messages, row)["input_ids"])
    mask = np.zeros(full.shape[0], dtype=bool)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _ids(
            _render(tokenizer, messages[:k], row, add_generation_prompt=True)["input_ids"]
        )
        through = _ids(_render(tokenizer, messages[: k + 1], row)["input_ids"])
        end = through.shape[0]
        if end > full.shape[0] or not np.array_equal(full[:end], through):
            raise SFTDataError(
                f"{row.where}: the chat template has no {{% generation %}} markers, and the "
                f"conversation up to messages[{k}] does not render as the start of the whole "
                "one, so its assistant turns cannot be found; mark them with "
                "{% generation %} ... {% endgeneration %} in the template, or set loss_on "
                "to 'all'"
            )
        n = min(before.shape[0], end)
        differ = np.flatnonzero(before[:n] != through[:n])
        mask[int(differ[0]) if differ.size else n : end] = True
    if not mask.any():
        raise SFTDataError(f"{row.where}: no assistant tokens in this row (loss_on='completion')")
    return full, mask


def _ids(values: Sequence[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def _completion_masked(
    prompt_ids: Sequence[int], ids: Sequence[int], loss_on: str
) -> tuple[np.ndarray, np.ndarray]:
    full = _ids(ids)
    if loss_on == "all":
        return full, np.ones(full.shape[0], dtype=bool)
    prompt = _ids(prompt_ids)
    n = min(prompt.shape[0], full.shape[0])
    differ = np.flatnonzero(prompt[:n] != full[:n])
    start = int(differ[0]) if differ.size else n  # the longest common prefix, as TRL
    mask = np.zeros(full.shape[0], dtype=bool)
    mask[start:] = True
    return full, mask


def _encode(tokenizer: Any, text: str, row: SFTRow) -> list[int]:
    try:
        return tokenizer(text=text)["input_ids"]
    except Exception as exc:  # tokenizers raise assorted errors
        raise SFTDataError(f"{row.where}: the tokenizer fails on this row ({exc})") from None


def _check_template(tokenizer: Any, row: SFTRow) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise SFTDataError(
            f"{row.where}: a conversational row needs a tokenizer with a chat template "
            "(chat_template in tokenizer_config.json, or chat_template.jinja)"
        )


def _render(tokenizer: Any, messages: list[dict[str, str]], row: SFTRow, **kwargs: Any) -> Any:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    except Exception as exc:  # jinja2 TemplateError / UndefinedError / TypeError, ...
        raise SFTDataError(
            f"{row.where}: the chat template does not render this row ({type(exc).__name__}: {exc})"
        ) from None
