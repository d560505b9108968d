"""Prepare a training corpus: text -> (optional trained BPE tokenizer) -> Megatron indexed files, cached.

Two corpora:

- ``"stdlib"``: Python's standard-library sources, present on every machine with
  Python. Files ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, in sorted
  relative-path order, skipping the ``test``/``tests``/``idlelib``/``lib2to3``
  packages, ``site-packages``, ``__pycache__`` and the build-specific
  ``_sysconfigdata*`` modules (they differ between machines of one Python version),
  taken until ``corpus_max_bytes`` bytes are collected; one file = one document.
  (Its content depends on the Python version, which is part of the cache key: tests
  that need a fixed corpus pass a JSONL file.)
- a JSONL file: one document per line, the text under ``data.json_keys[0]``.
- a ``.txt`` file (UTF-8): documents separated by blank lines (one or more lines
  holding only whitespace), each document's own line breaks kept; a file without
  blank lines is one document.

With ``data.split_sentences`` every document becomes its list of sentences (one
sequence each, no end-of-document token: Megatron's ``--split-sentences``, which
BERT's data needs); with ``data.wordpiece_vocab_size > 0`` a WordPiece vocabulary
is trained on the corpus (offline, deterministic) and saved as ``vocab.txt`` for
``BertWordPieceLowerCase``. With ``data.bpe_vocab_size > 0`` a byte-level BPE tokenizer (GPT-2 style
pre-tokenization, ``<|endoftext|>`` as id 0 and end-of-document) is trained on the
corpus with Hugging Face ``tokenizers`` (deterministic for the same input) and
saved as ``tokenizer.json``; otherwise ``data.tokenizer_type`` is used.

The result is cached under ``<cache_dir>/corpus-<key>/`` where ``key`` hashes
the corpus content and the tokenizer settings; the folder is built under a
temporary name and renamed when complete, so concurrent or interrupted
preparations never leave a half-written cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.data.indexed.preprocess import preprocess_documents
from epochal.data.indexed.sentence_split import split_sentences
from epochal.data.indexed.tokenizer import HuggingFaceTokenizer, Tokenizer, build_tokenizer
from epochal.data.indexed.tokenizer_wordpiece import train_wordpiece
from epochal.model.config import ConfigError
from epochal.train.config import DataConfig
from epochal.train.inputs.cache_temporaries import cache_temporary
from epochal.train.inputs.recorded_tokenizer import (
    DEFAULT_TOKENIZER,
    check_recorded_tokenizer,
    with_recorded_tokenizer,
)

__all__ = [
    "PreparedCorpus",
    "default_cache_dir",
    "prepare_corpus",
    "stdlib_files",
    "tokenizer_from_config",
]

_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"}
_FORMAT = 1
EOD_TOKEN = "<|endoftext|>"
WORDPIECE_TOKENIZER = "BertWordPieceLowerCase"


@dataclass
class PreparedCorpus:
    """A tokenized corpus ready for training.

    Attributes:
        prefix: the indexed dataset prefix (``.bin``/``.idx``).
        tokenizer: the tokenizer that produced it.
        tokenizer_file: the trained ``tokenizer.json``, if one was trained.
        documents / tokens: counts.
        cached: whether it came from the cache.
        seconds: preparation time (0 when cached).
    """

    prefix: str
    tokenizer: Tokenizer
    tokenizer_file: str | None
    documents: int
    tokens: int
    cached: bool
    seconds: float


def default_cache_dir() -> Path:
    """``$EPOCHAL_CACHE`` or ``~/.cache/epochal``."""
    env = os.environ.get("EPOCHAL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "epochal"


def stdlib_files(max_bytes: int) -> list[Path]:
    """The deterministic subset of standard-library sources (see the module docstring).

    Order: a depth-first walk with sorted names, a folder's files before its
    subfolders; files are taken until ``max_bytes`` bytes are collected.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    chosen, total = [], 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_PARTS and not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if not name.endswith(".py") or name.startswith("_sysconfigdata"):
                continue
            if not path.is_file():
                continue
            chosen.append(path)
            total += path.stat().st_size
            if total >= max_bytes:
                return chosen
    if not chosen:
        raise OSError(f"no Python sources found under {root}")
    return chosen


def _read_documents(cfg: DataConfig) -> tuple[list[str], str]:
    """The corpus documents and a description for messages."""
    if cfg.corpus == "stdlib":
        files = stdlib_files(cfg.corpus_max_bytes)
        docs = [p.read_text(encoding="utf-8", errors="replace") for p in files]
        return (
            docs,
            f"{len(files)} Python {sys.version_info.major}.{sys.version_info.minor} standard-library files",
        )
    path = Path(cfg.corpus)
    if not path.is_file():
        raise ConfigError(
            "data.corpus", f"{path} is neither 'stdlib' nor an existing .jsonl or .txt file"
        )
    if path.suffix == ".txt":
        docs = _read_text_documents(path)
        return docs, f"{len(docs)} documents from {path}"
    key = cfg.json_keys[0]
    docs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record[key]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{lineno}: not a JSON object with a {key!r} string ({exc})"
                ) from None
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}:{lineno}: {key!r} is {type(text).__name__}, expected a string"
                )
            docs.append(text)
    if not docs:
        raise ValueError(f"{path}: no documents")
    return docs, f"{len(docs)} documents from {path}"


def _read_text_documents(path: Path) -> list[str]:
    """The documents of a ``.txt`` corpus: blocks of text between blank lines.

    Raises:
        ValueError: the file is not UTF-8 (names the byte offset) or holds no text.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    docs, lines = [], []
    for line in text.splitlines(keepends=True):
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append("".join(lines).rstrip("\n"))
            lines = []
    if lines:
        docs.append("".join(lines).rstrip("\n"))
    if not docs:
        raise ValueError(f"{path}: no documents (the file holds only blank lines)")
    return docs


def tokenizer_from_config(cfg: DataConfig) -> Tokenizer:
    """Build ``data.tokenizer_type`` from its files (Megatron's argument names).

    ``""`` (unset) is the tokenizer ``epochal preprocess`` recorded with the data
    paths, else ``GPT2BPETokenizer``; a tokenizer other than the recorded one is
    refused (:mod:`epochal.train.inputs.recorded_tokenizer`).

    Raises:
        ConfigError: the tokenizer cannot be built, or differs from the data's record
            (names ``data.tokenizer_type``).
    """
    cfg = with_recorded_tokenizer(cfg)
    try:
        tokenizer = build_tokenizer(
            cfg.tokenizer_type,
            vocab_file=cfg.vocab_file or None,
            merge_file=cfg.merge_file or None,
            tokenizer_model=cfg.tokenizer_model or None,
            vocab_extra_ids=cfg.vocab_extra_ids,
        )
    except (ValueError, OSError) as exc:
        raise ConfigError("data.tokenizer_type", str(exc)) from None
    check_recorded_tokenizer(cfg, tokenizer)
    return tokenizer


def _train_bpe(docs: list[str], vocab_size: int, out: Path) -> None:
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok.save(str(out))


def _cache_key(cfg: DataConfig, docs: list[str]) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            {
                "format": _FORMAT,
                "corpus": cfg.corpus if cfg.corpus == "stdlib" else os.path.abspath(cfg.corpus),
                "json_key": cfg.json_keys[0],
                "bpe_vocab_size": cfg.bpe_vocab_size,
                "tokenizer": [
                    cfg.tokenizer_type or DEFAULT_TOKENIZER,
                    cfg.tokenizer_model,
                    cfg.vocab_file,
                    cfg.merge_file,
                ]
                if not cfg.bpe_vocab_size
                else None,
            },
            sort_keys=True,
        ).encode()
    )
    if cfg.split_sentences or cfg.wordpiece_vocab_size:  # (GPT cache keys unchanged)
        h.update(json.dumps([cfg.split_sentences, cfg.wordpiece_vocab_size]).encode())
    for d in docs:
        h.update(hashlib.sha256(d.encode("utf-8", errors="replace")).digest())
    return h.hexdigest()[:20]


def prepare_corpus(
    cfg: DataConfig, cache_dir: str | os.PathLike | None = None, *, log: Any = None
) -> PreparedCorpus:
    """Tokenize ``cfg.corpus`` into indexed files (cached); see the module docstring.

    Args:
        cfg: the data section (``corpus``, ``corpus_max_bytes``, ``json_keys``,
            ``bpe_vocab_size`` or the tokenizer options).
        cache_dir: cache root (default ``cfg.cache_dir`` or :func:`default_cache_dir`).
        log: ``log(str)`` for progress messages (None = silent).

    Raises:
        ConfigError: a bad corpus or tokenizer option.
        ValueError: a malformed JSONL corpus (names the file and line).
    """
    say = log or (lambda _msg: None)
    root = Path(cache_dir or cfg.cache_dir or default_cache_dir())
    docs, description = _read_documents(cfg)
    folder = root / f"corpus-{_cache_key(cfg, docs)}"
    done = folder / "corpus.json"
    cached = done.is_file()
    t0 = time.perf_counter()
    tokenizer = None if cached else _build(cfg, docs, description, folder, say)
    info = json.loads(done.read_text())
    tok_file = info.get("tokenizer_file")
    vocab_file = info.get("vocab_file")
    if tok_file:
        tokenizer = HuggingFaceTokenizer(folder / tok_file, eod_token=EOD_TOKEN)
    elif vocab_file:
        tok_file = vocab_file
        # sentinels (T5) are appended after the trained vocabulary: the corpus ids do not change
        tokenizer = build_tokenizer(
            WORDPIECE_TOKENIZER,
            vocab_file=str(folder / vocab_file),
            vocab_extra_ids=cfg.vocab_extra_ids,
        )
    elif tokenizer is None:
        tokenizer = tokenizer_from_config(cfg)
    return PreparedCorpus(
        str(folder / "corpus"),
        tokenizer,
        str(folder / tok_file) if tok_file else None,
        info["documents"],
        info["tokens"],
        cached=cached,
        seconds=0.0 if cached else time.perf_counter() - t0,
    )


def _build(
    cfg: DataConfig, docs: list[str], description: str, folder: Path, say: Any
) -> Tokenizer | None:
    """Write the cache ``folder`` (tokenizer, indexed files, ``corpus.json``) under a temporary name.

    Returns:
        The tokenizer used if it was built from ``data.tokenizer_type`` (None for a
        trained one, which is reloaded from ``folder``).
    """
    tmp = cache_temporary(folder, "corpus-")
    tmp.mkdir()
    try:
        tok_file = None
        vocab_file = None
        if cfg.wordpiece_vocab_size:
            say(
                f"training a {cfg.wordpiece_vocab_size}-id WordPiece vocabulary on {description} ..."
            )
            train_wordpiece(docs, cfg.wordpiece_vocab_size, tmp / "vocab.txt")
            vocab_file = "vocab.txt"
            tokenizer: Tokenizer = build_tokenizer(
                WORDPIECE_TOKENIZER, vocab_file=str(tmp / vocab_file)
            )
        elif cfg.bpe_vocab_size:
            say(f"training a {cfg.bpe_vocab_size}-id BPE tokenizer on {description} ...")
            _train_bpe(docs, cfg.bpe_vocab_size, tmp / "tokenizer.json")
            tok_file = "tokenizer.json"
            tokenizer = HuggingFaceTokenizer(tmp / tok_file, eod_token=EOD_TOKEN)
        else:
            tokenizer = tokenizer_from_config(cfg)
        inputs: list[Any] = list(docs)
        if cfg.split_sentences:
            say(f"splitting {description} into sentences ...")
            inputs = [split_sentences(doc) for doc in docs]
        say(f"tokenizing {description} ...")
        summary = preprocess_documents(
            inputs, tokenizer, tmp / "corpus", append_eod=not cfg.split_sentences
        )
        info = {
            "format": _FORMAT,
            "description": description,
            "documents": summary.documents,
            "tokens": summary.total_tokens,
            "tokenizer_file": tok_file,
            "vocab_file": vocab_file,
        }
        (tmp / "corpus.json").write_text(json.dumps(info, indent=1))
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (folder / "corpus.json").is_file():  # not a concurrent winner: a real error
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return None if tok_file or vocab_file else tokenizer
