"""The tokenizer files of an exported Hugging Face folder, agreeing with its ``config.json``.

``AutoTokenizer.from_pretrained(folder)`` reads ``tokenizer.json`` (the
vocabulary and the pipeline) and takes the special tokens from
``tokenizer_config.json`` / ``special_tokens_map.json``; without them it has no
``eos_token``, ``bos_token`` or ``pad_token``. :func:`hf_tokenizer_files` writes
all three so that each token's id is the ``*_token_id`` of ``config.json``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from epochal.formats.common import ConversionError

__all__ = ["hf_tokenizer_files"]


def _first(token_id: int | list[int] | None) -> int | None:
    if isinstance(token_id, list | tuple):
        return int(token_id[0]) if token_id else None
    return None if token_id is None else int(token_id)


def hf_tokenizer_files(
    tokenizer_json: str | os.PathLike,
    *,
    bos_token_id: int | list[int] | None,
    eos_token_id: int | list[int] | None,
    pad_token_id: int | None,
    model_max_length: int,
) -> dict[str, str]:
    """The texts of ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``.

    Args:
        tokenizer_json: a Hugging Face ``tokenizers`` JSON file (copied unchanged).
        bos_token_id / eos_token_id / pad_token_id: the ids ``config.json`` holds
            (``eos_token_id`` may be a list: its first id is the ``eos_token``);
            None leaves that token unset.
        model_max_length: the longest input in tokens (``max_position_embeddings``).

    Returns:
        ``{file name: text}``, to be written next to ``config.json``.

    Raises:
        ConversionError: the file is not a tokenizer, or an id is outside its
            vocabulary (names the file and the id).
    """
    from tokenizers import Tokenizer

    path = os.fspath(tokenizer_json)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        backend = Tokenizer.from_str(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversionError(f"{path}: cannot read the tokenizer ({exc})") from exc
    except Exception as exc:  # the Rust library raises plain Exception
        raise ConversionError(f"{path}: not a Hugging Face tokenizers JSON file ({exc})") from exc
    special: dict[str, Any] = {}
    for role, token_id in (
        ("bos_token", _first(bos_token_id)),
        ("eos_token", _first(eos_token_id)),
        ("pad_token", pad_token_id),
    ):
        if token_id is None:
            continue
        token = backend.id_to_token(token_id)
        if token is None:
            raise ConversionError(
                f"{path}: {role}_id {token_id} is not in the tokenizer's vocabulary "
                f"({backend.get_vocab_size(with_added_tokens=True)} ids)"
            )
        special[role] = token
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": int(model_max_length),
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        **special,
    }

    def dump(obj: dict[str, Any]) -> str:
        return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    return {
        "tokenizer.json": text,
        "tokenizer_config.json": dump(config),
        "special_tokens_map.json": dump(special),
    }
