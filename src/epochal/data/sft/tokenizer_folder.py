"""What a Hugging Face tokenizer folder must not hold before ``transformers`` reads it.

:func:`check_tokenizer_folder` reads a folder's ``tokenizer_config.json``,
and ``config.json`` (plain JSON, no code) and refuses:

- **custom code**: an ``auto_map`` entry that ``AutoTokenizer.from_pretrained`` would
  follow into a Python file of the folder (or of a Hub repository): in
  ``tokenizer_config.json`` its ``AutoTokenizer`` entry (or the legacy list form), in
  ``config.json`` its ``AutoConfig`` and ``AutoTokenizer`` entries (``AutoTokenizer``
  reads the model's configuration first). ``transformers`` would ask "run the custom
  code? [y/N]" in the middle of a run, and run the file on "y"; epochal loads every
  tokenizer with ``trust_remote_code=False`` and says which entry and file instead.
  Entries for model classes (``AutoModelForCausalLM``, ...) are not followed by a
  tokenizer and are left alone.
- **a chat template that is not text**: ``chat_template`` must be a Jinja string, or
  a list of ``{"name": str, "template": str}`` objects (named templates, as
  ``transformers`` saves them).

Every error names the file, the entry and the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from epochal.data.sft.rows import SFTDataError

__all__ = ["check_chat_template", "check_tokenizer_folder", "custom_code_entries"]

#: per file, the ``auto_map`` keys that loading a tokenizer follows
_FOLLOWED = {
    "tokenizer_config.json": ("AutoTokenizer",),
    "config.json": ("AutoConfig", "AutoTokenizer"),
}


def _json_object(path: Path) -> dict[str, Any] | None:
    """The file's JSON object; None when absent or not a JSON object (transformers says why)."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _python_file(reference: str) -> tuple[str, str | None]:
    """``"tokenization_x.XTokenizer"`` -> ``("tokenization_x.py", None)``; a
    ``"org/repo--module.Class"`` reference -> ``("module.py", "org/repo")``."""
    repo = None
    if "--" in reference:
        repo, reference = reference.split("--", 1)
    module = reference.rsplit(".", 1)[0] if "." in reference else reference
    return module.replace(".", "/") + ".py", repo


def custom_code_entries(folder: str | os.PathLike) -> list[tuple[Path, str, str]]:
    """The ``auto_map`` entries of a folder that loading its tokenizer would run.

    Returns:
        ``(file, entry, class reference)`` for each, e.g. ``(.../tokenizer_config.json,
        "AutoTokenizer", "tokenization_x.XTokenizer")``; empty when there are none.
    """
    root = Path(folder)
    found: list[tuple[Path, str, str]] = []
    for name, keys in _FOLLOWED.items():
        path = root / name
        config = _json_object(path)
        auto_map = None if config is None else config.get("auto_map")
        if not auto_map:
            continue
        if isinstance(auto_map, list | tuple):  # the legacy form: [slow, fast] tokenizer
            entries = [("auto_map", auto_map)] if name == "tokenizer_config.json" else []
        elif isinstance(auto_map, dict):
            entries = [(key, auto_map[key]) for key in keys if auto_map.get(key)]
        else:
            entries = [("auto_map", auto_map)]
        for key, value in entries:
            references = value if isinstance(value, list | tuple) else [value]
            for reference in references:
                if reference:
                    found.append((path, key, str(reference)))
    return found


def check_chat_template(value: Any, where: str) -> None:
    """Refuse a ``chat_template`` value that is neither a string nor named templates.

    Args:
        value: the value (``None``: no template, accepted).
        where: the file it comes from, for the message.

    Raises:
        SFTDataError: names ``where`` and the value's type.
    """
    if value is None or isinstance(value, str):
        return
    if isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        return
    if isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    ):
        return
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise SFTDataError(
        f'{where}: "chat_template" must be a Jinja template string (or a list of '
        f'{{"name": ..., "template": ...}} objects), got {type(value).__name__} {shown}; '
        "fix it, or remove it to use no chat template"
    )


def check_tokenizer_folder(folder: str | os.PathLike) -> None:
    """Refuse a tokenizer folder that would run custom code or has a chat template that is not text.

    See the module docstring. Reads only JSON files; imports nothing of the folder.

    Raises:
        SFTDataError: the first custom-code entry (naming the file, the ``auto_map``
            entry and the Python file it names) or the malformed ``chat_template``.
    """
    root = Path(folder)
    for path, key, reference in custom_code_entries(root):
        module, repo = _python_file(reference)
        where = f"{module} of the Hub repository {repo}" if repo else str(root / module)
        entry = "auto_map" if key == "auto_map" else f"auto_map.{key}"
        raise SFTDataError(
            f"{path}: {entry} = {reference!r} names custom code ({where}), which epochal "
            "never runs (tokenizers load with trust_remote_code=False); use a tokenizer "
            "folder that transformers loads without it (a tokenizer.json with a "
            "tokenizer_class transformers knows, e.g. PreTrainedTokenizerFast), or remove "
            f"the {entry} entry if the folder loads without it",
            source=str(root),
        )
    config = _json_object(root / "tokenizer_config.json")
    if config is not None:
        check_chat_template(config.get("chat_template"), str(root / "tokenizer_config.json"))
