"""``epochal generate --chat``: conversations through the checkpoint's chat template, replies out.

The prompts are rendered as ``transformers``' ``apply_chat_template(messages,
add_generation_prompt=True)`` renders them (:func:`epochal.data.sft.chat_prompt_ids`),
generation stops at the end of the assistant's turn
(:func:`epochal.data.sft.end_of_turn_ids`; the model's ``generation_config.json`` eos ids,
:func:`model_eos_ids`; ``--stop``; ``--stop-token-id``), and each reply is printed without the prompt and
the special tokens (``decode(..., skip_special_tokens=True)``, the end-of-turn token
left out). With one conversation standard output is the reply alone; with several each
reply follows a ``=== [i] <last user message>`` line. The timing line goes to
standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epochal._text import plural

__all__ = ["ChatPrompts", "chat_prompts", "end_of_turn_stops", "model_eos_ids"]


@dataclass
class ChatPrompts:
    """The rendered conversations of ``--chat`` and how to print their replies.

    Attributes:
        ids: each conversation's prompt ids (the template's generation prompt included).
        shown: each conversation's last user message (what the header line shows).
        stops: the stop ids (end of turn).
        tokenizer: the ``transformers`` chat tokenizer.
        messages: each conversation's messages.
    """

    ids: list[list[int]]
    shown: list[str | None]
    stops: list[int]
    tokenizer: Any
    messages: list[list[dict[str, str]]] = field(default_factory=list)

    def reply(self, tokens: list[int]) -> str:
        """The assistant's reply of generated ``tokens``: the end-of-turn token and special tokens dropped."""
        if tokens and tokens[-1] in self.stops:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def report(self, args: argparse.Namespace, out: Any, seconds: float, t_load: float) -> int:
        """Print the replies (and write ``--output`` JSONL); the timing line to standard error."""
        records = []
        per_prompt = args.num_return_sequences if args.num_beams > 1 else 1
        several = len(out.tokens) > 1
        for j, tokens in enumerate(out.tokens):
            i = j // per_prompt
            reply = self.reply(tokens)
            record = {
                "prompt_index": i,
                "messages": self.messages[i],
                "prompt_ids": self.ids[i],
                "tokens": tokens,
                "reply": reply,
                "finished": out.finished[j],
            }
            if out.scores is not None:
                record["score"] = out.scores[j]
            records.append(record)
            if several:
                print(f"=== [{i}] {self.shown[i]}")
            print(reply)
        if args.output:
            from epochal._atomic import atomic_write

            atomic_write(args.output, "".join(json.dumps(r) + "\n" for r in records))
        n = sum(len(t) for t in out.tokens)
        print(
            f"generated {plural(n, 'token')} for {plural(len(self.ids), 'conversation')} in "
            f"{seconds:.2f} s ({n / max(seconds, 1e-9):.1f} tokens/s; load {t_load:.2f} s; "
            f"TP{args.tensor_parallel})",
            file=sys.stderr,
        )
        return 0


def _chat_tokenizer(args: argparse.Namespace, ck: Any) -> Any:
    from epochal.data.sft import SFTDataError, has_chat_template, load_chat_tokenizer

    if args.tokenizer_model and Path(args.tokenizer_model).is_dir():
        option, folder = "--tokenizer-model", args.tokenizer_model
    elif ck.chat_folder is not None:
        option, folder = "--checkpoint", ck.chat_folder
    else:
        raise ValueError(
            f"--chat: {args.checkpoint} names no tokenizer folder with a chat template (a "
            "fine-tuning run records its sft.tokenizer, a Hugging Face folder holds "
            "tokenizer_config.json); pass --tokenizer-type HuggingFaceTokenizer "
            "--tokenizer-model FOLDER"
        )
    try:
        tokenizer = load_chat_tokenizer(folder)
    except SFTDataError as exc:
        raise ValueError(f"--chat: {option}: {exc}") from None
    if not has_chat_template(tokenizer):
        raise ValueError(
            f"--chat: {option}: the tokenizer in {folder} has no chat template (chat_template "
            "in tokenizer_config.json, or chat_template.jinja); leave --chat out for plain text"
        )
    return tokenizer


def end_of_turn_stops(ck: Any) -> list[int]:
    """The end-of-turn ids of a checkpoint whose tokenizer has a chat template, for plain generation.

    A chat model ends each answer with its end-of-turn token; ``transformers`` stops
    there because the model's ``generation_config.json`` lists it as ``eos_token_id``
    (what ``epochal convert --to hf`` writes for a fine-tuning run). Plain
    ``epochal generate`` of the run, or of a Hugging Face folder whose tokenizer has a
    chat template, stops at the same ids :func:`chat_prompts` stops at
    (:func:`epochal.data.sft.end_of_turn_ids`). Empty without a chat tokenizer folder,
    or when it has no chat template or cannot be loaded (plain text models).

    Args:
        ck: the :class:`~epochal.convert.formats.ModelCheckpoint`.
    """
    if ck.chat_folder is None:
        return []
    from epochal.data.sft import (
        SFTDataError,
        end_of_turn_ids,
        has_chat_template,
        load_chat_tokenizer,
    )

    try:
        tokenizer = load_chat_tokenizer(ck.chat_folder)
    except (SFTDataError, ImportError):
        return []
    if not has_chat_template(tokenizer):
        return []
    return end_of_turn_ids(tokenizer, extra=model_eos_ids(ck))


def model_eos_ids(ck: Any) -> tuple[int, ...]:
    """The model's own eos ids: a Hugging Face checkpoint's, else its chat folder's ``generation_config.json``.

    A fine-tuning run started from a Hugging Face folder keeps that folder's eos ids
    (``epochal convert --to hf`` lists them in the export's ``generation_config.json``).

    Raises:
        ConversionError: the folder's ``generation_config.json`` is malformed (a ``ValueError``).
    """
    if ck.eos_token_ids or ck.chat_folder is None:
        return tuple(ck.eos_token_ids)
    from epochal.convert.formats import generation_eos_ids

    return generation_eos_ids(ck.chat_folder)


def prompt_file_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, line)`` of ``--prompt-file``'s non-blank lines.

    Raises:
        FileNotFoundError: the file cannot be read (naming ``--prompt-file``).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise FileNotFoundError(f"--prompt-file {path}: {exc}") from None
    return [(n, line) for n, line in enumerate(lines, 1) if line.strip()]


def _conversations(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    out = [[*system, {"role": "user", "content": text}] for text in args.prompt]
    if args.prompt_file:
        path = Path(args.prompt_file)
        for n, line in prompt_file_lines(path):
            if not line.lstrip().startswith("{"):
                out.append([*system, {"role": "user", "content": line}])
                continue
            try:
                record = json.loads(line)
                messages = record.get("messages")
                if messages is None:
                    messages = [{"role": "user", "content": str(record["text"])}]
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise ValueError(
                    f"--prompt-file {path}:{n}: JSON line without 'messages' or 'text'"
                ) from None
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"--prompt-file {path}:{n}: 'messages' must be a non-empty list")
            has_system = isinstance(messages[0], dict) and messages[0].get("role") == "system"
            out.append(list(messages) if has_system else [*system, *messages])
    if not out:
        raise ValueError("nothing to generate: give --prompt or --prompt-file")
    return out


def chat_prompts(args: argparse.Namespace, ck: Any) -> ChatPrompts:
    """Render ``--chat``'s conversations with the checkpoint's chat template.

    Raises:
        ValueError: ``--prompt-ids`` or ``--add-bos`` with ``--chat``, no chat template
            (names where it was looked for and the fix), a conversation the template
            does not render, a ``--stop`` text that is not one token.
    """
    from epochal.data.sft import SFTDataError, chat_prompt_ids, end_of_turn_ids, token_ids

    if args.prompt_ids:
        raise ValueError("--chat renders text messages; --prompt-ids are tokens already")
    if args.add_bos:
        raise ValueError("--chat: the chat template writes the BOS token itself; drop --add-bos")
    tokenizer = _chat_tokenizer(args, ck)
    conversations = _conversations(args)
    ids = []
    for n, messages in enumerate(conversations):
        try:
            ids.append(chat_prompt_ids(tokenizer, messages))
        except SFTDataError as exc:
            raise ValueError(f"--chat: conversation {n}: {exc}") from None
    stops = list(args.stop_token_id)
    try:
        stops += token_ids(tokenizer, args.stop, option="--stop")
    except SFTDataError as exc:
        raise ValueError(str(exc)) from None
    if not args.no_stop_at_eod:
        stops += end_of_turn_ids(tokenizer, extra=model_eos_ids(ck))
    stops = [t for t in dict.fromkeys(stops) if 0 <= t < ck.config.vocab_size]
    shown = [
        next((m["content"] for m in reversed(c) if m.get("role") == "user"), None)
        for c in conversations
    ]
    return ChatPrompts(ids, shown, stops, tokenizer, conversations)
