"""Chatting with a fine-tuned model: prompts through the chat template, end-of-turn tokens, files.

What ``epochal generate --chat`` and ``epochal convert --to hf`` need of a chat
tokenizer (a ``transformers`` tokenizer with a chat template, e.g. from
:func:`~epochal.data.sft.tokenize.load_chat_tokenizer`):

- :func:`chat_prompt_ids`: a conversation rendered as ``transformers``'
  ``apply_chat_template(messages, add_generation_prompt=True)`` renders it: the ids a
  model answers after, the same ids the fine-tuning rows were tokenized with;
- :func:`end_of_turn_ids`: the tokens that end an assistant turn, where generation
  stops: the tokenizer's EOS, the token the template writes after an assistant's
  message (found by rendering one), and the usual end-of-turn tokens
  (``<|im_end|>``, ``<|eot_id|>``, ``<end_of_turn>``, ...) where the vocabulary holds
  them as special tokens;
- :func:`chat_tokenizer_files`: the tokenizer files of a folder, to ship unchanged
  with exported weights (so that ``AutoTokenizer`` of the export renders the same ids).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from epochal.data.sft.rows import ROLES, SFTDataError

__all__ = [
    "CHAT_TOKENIZER_FILES",
    "END_OF_TURN_TOKENS",
    "chat_prompt_ids",
    "chat_tokenizer_files",
    "end_of_turn_ids",
    "has_chat_template",
    "token_ids",
]

#: end-of-turn tokens of common chat templates (ChatML / Qwen, Llama 3, Gemma, Phi-3, ...)
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<|eot|>",
    "<|endofturn|>",
)

#: the files of a Hugging Face tokenizer folder (what ``save_pretrained`` writes and
#: ``AutoTokenizer.from_pretrained`` reads), copied with exported weights
CHAT_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)

_PROBE = "\u2063epochal-probe\u2063"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether a ``transformers`` tokenizer has a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """``apply_chat_template(messages, add_generation_prompt=True)``'s token ids.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        messages: ``{"role", "content"}`` dicts (roles system / user / assistant),
            ending with the turn to answer.

    Raises:
        SFTDataError: no chat template, an unknown role or a non-string content, or a
            template that does not render the conversation (the message says why).
    """
    if not has_chat_template(tokenizer):
        raise SFTDataError(
            "the tokenizer has no chat template (chat_template in tokenizer_config.json, "
            "or chat_template.jinja)"
        )
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise SFTDataError(f"message {n}: expected {{'role': ..., 'content': ...}}")
        if message["role"] not in ROLES or not isinstance(message["content"], str):
            raise SFTDataError(
                f"message {n}: role must be one of {', '.join(ROLES)} and content a string, "
                f"got {message!r}"
            )
    try:
        out = tokenizer.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=True, return_dict=True
        )
    except Exception as exc:  # jinja2 TemplateError / UndefinedError / TypeError, ...
        raise SFTDataError(
            f"the chat template does not render this conversation ({type(exc).__name__}: {exc})"
        ) from None
    return [int(t) for t in out["input_ids"]]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(int(i) for i, tok in decoder.items() if getattr(tok, "special", True))
    return ids


def _template_end_of_turn(tokenizer: Any) -> int | None:
    """The special token the template writes right after an assistant's message, if any."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}],
            tokenize=False,
        )
    except Exception:  # a template that wants another conversation shape: no probe
        return None
    if not isinstance(text, str) or _PROBE not in text:
        return None
    rest = text.split(_PROBE, 1)[1]
    if not rest:
        return None
    ids = tokenizer(rest, add_special_tokens=False)["input_ids"]
    return int(ids[0]) if ids and int(ids[0]) in _special_ids(tokenizer) else None


def end_of_turn_ids(tokenizer: Any, extra: Iterable[int] = ()) -> list[int]:
    """The ids that end an assistant's turn, in order: EOS, ``extra``, the template's, the usual.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        extra: ids to include after EOS (e.g. a model's ``generation_config.json``
            ``eos_token_id``).

    Returns:
        Distinct ids; empty when the tokenizer has none of them.
    """
    ids: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(int(eos))
    ids += [int(t) for t in extra]
    probed = _template_end_of_turn(tokenizer)
    if probed is not None:
        ids.append(probed)
    special = _special_ids(tokenizer)
    vocab = tokenizer.get_vocab()
    ids += [vocab[name] for name in END_OF_TURN_TOKENS if vocab.get(name) in special]
    return list(dict.fromkeys(ids))


def token_ids(tokenizer: Any, tokens: Iterable[str], *, option: str = "--stop") -> list[int]:
    """The ids of token strings (``"<|im_end|>"``), each one token of the vocabulary.

    A string that is not a token of the vocabulary but encodes to exactly one id
    (``"."``) is that id.

    Raises:
        SFTDataError: a string that is neither one token nor encodes to one id
            (names ``option``).
    """
    vocab = tokenizer.get_vocab()
    out: list[int] = []
    for token in tokens:
        if token in vocab:
            out.append(int(vocab[token]))
            continue
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise SFTDataError(
                f"{option} {token!r}: not one token of the tokenizer (it encodes to "
                f"{len(ids)} tokens {list(ids)}); give a single token such as the "
                "end-of-turn token, or its id with --stop-token-id"
            )
        out.append(int(ids[0]))
    return out


def chat_tokenizer_files(folder: str | os.PathLike) -> dict[str, bytes]:
    """The tokenizer files of a Hugging Face folder, by name (those of :data:`CHAT_TOKENIZER_FILES`).

    The files are unchanged, except that a template kept in ``chat_template.jinja`` is
    also written into ``tokenizer_config.json``'s ``chat_template`` when that lacks one
    (where ``transformers`` releases before the ``.jinja`` file look for it).

    Raises:
        SFTDataError: the folder has no ``tokenizer_config.json`` or no
            ``tokenizer.json`` / ``tokenizer.model`` / ``vocab.*`` (names it).
    """
    root = Path(folder)
    files = {
        name: (root / name).read_bytes() for name in CHAT_TOKENIZER_FILES if (root / name).is_file()
    }
    if "tokenizer_config.json" not in files or not {
        "tokenizer.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
    } & set(files):
        raise SFTDataError(
            f"{root}: not a Hugging Face tokenizer folder (needs tokenizer_config.json and "
            "tokenizer.json or the vocabulary files)"
        )
    template = files.get("chat_template.jinja")
    if template is not None:  # also where readers older than chat_template.jinja look
        try:
            config = json.loads(files["tokenizer_config.json"])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SFTDataError(f"{root / 'tokenizer_config.json'}: not JSON ({exc})") from None
        if isinstance(config, dict) and "chat_template" not in config:
            config["chat_template"] = template.decode("utf-8")
            text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
            files["tokenizer_config.json"] = text.encode("utf-8")
    return files
