"""The tokenizer of ``data.data_path``: the one ``epochal preprocess`` recorded, or a clear error.

Every prefix of the data paths (``data.data_path``, ``train/valid/test_data_path``)
may have a tokenizer record (:mod:`epochal.data.indexed.tokenizer_record`):

- :func:`with_recorded_tokenizer`: ``data.tokenizer_type = ""`` (the default: no
  tokenizer given) takes the recorded tokenizer and its files (options the
  configuration sets explicitly are kept); without a record it is
  ``GPT2BPETokenizer``, Megatron's default. Prefixes recorded with
  different tokenizers are refused (naming ``data.data_path``).
- :func:`check_recorded_tokenizer`: the tokenizer the run built must give the
  recorded ids (same fingerprint: vocabulary size, end-of-document id and the ids
  of a probe text), else a ``ConfigError`` naming ``data.tokenizer_type`` and both
  tokenizers; a corpus preprocessed with ``--tokenizer-type bytes`` then never trains
  with GPT-2's vocabulary and end-of-document id.

Prefixes without a record (Megatron's own files) are not checked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from epochal.data.datasets.dataset_builder import parse_blend
from epochal.data.indexed.tokenizer import canonical_tokenizer_type
from epochal.data.indexed.tokenizer_record import (
    OPTIONS,
    TokenizerRecordError,
    read_tokenizer_record,
    record_path,
    tokenizer_fingerprint,
)
from epochal.model.config import ConfigError
from epochal.train.config.toml_io import holds_tokenizer

__all__ = [
    "DEFAULT_TOKENIZER",
    "check_model_vocab",
    "check_recorded_tokenizer",
    "effective_tokenizer_type",
    "recorded_tokenizers",
    "tokenizer_source",
    "with_recorded_tokenizer",
    "with_resolved_tokenizer",
]

#: What ``data.tokenizer_type = ""`` means for data without a record (Megatron's default).
DEFAULT_TOKENIZER = "GPT2BPETokenizer"
_PATH_OPTIONS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def recorded_tokenizers(data: Any) -> dict[str, dict[str, Any]]:
    """``{prefix: record}`` of the data paths' prefixes that have a tokenizer record.

    Raises:
        ConfigError: a malformed record (naming the data-path option and the file).
    """
    out: dict[str, dict[str, Any]] = {}
    for option in _PATH_OPTIONS:
        try:
            blend = parse_blend(getattr(data, option, None) or None, option)
        except ValueError:
            continue  # the data builder reports a malformed blend
        for prefix in blend[0] if blend else []:
            try:
                record = read_tokenizer_record(prefix)
            except TokenizerRecordError as exc:
                raise ConfigError(f"data.{option}", str(exc)) from None
            if record is not None:
                out[prefix] = record
    return out


#: the class names of tokenizers whose canonical type name differs.
_CLASS_TYPES = {"TiktokenTokenizer": "TikTokenizer"}


def _recorded(record: dict[str, Any]) -> dict[str, Any]:
    """A record's tokenizer as :func:`_describe` and :func:`_differences` read it."""
    files = [record[k] for k in ("vocab_file", "merge_file", "tokenizer_model") if record.get(k)]
    kind = record["tokenizer_type"]
    return {
        "type": canonical_tokenizer_type(kind) or kind,
        "files": " + ".join(files) or "its built-in files",  # as a tokenizer's ``source``
        "vocab_size": record.get("vocab_size"),
        "eod": record.get("eod"),
        "fingerprint": record["fingerprint"],
    }


def _given(tokenizer: Any) -> dict[str, Any]:
    """A built tokenizer as :func:`_describe` and :func:`_differences` read it."""
    kind = type(tokenizer).__name__
    if kind == "BertWordPieceTokenizer":
        kind = "BertWordPieceLowerCase" if tokenizer.lower_case else "BertWordPieceCase"
    source = getattr(tokenizer, "source", None)
    return {
        "type": _CLASS_TYPES.get(kind, kind),
        "files": str(source) if source else "its built-in files",
        "vocab_size": tokenizer.vocab_size,
        "eod": tokenizer.eod,
        "fingerprint": tokenizer_fingerprint(tokenizer),
    }


def _describe(tok: dict[str, Any]) -> str:
    files = "" if tok["files"] == "its built-in files" else f" ({tok['files']})"
    return (
        f"{tok['type']}{files}, {tok['vocab_size']} ids, end-of-document id {tok['eod']}, "
        f"fingerprint {tok['fingerprint'][:12]}"
    )


def _differences(a: dict[str, Any], b: dict[str, Any]) -> str:
    """What tells tokenizers ``a`` and ``b`` (fingerprints differ) apart, in words."""
    names = {"type": "type", "vocab_size": "vocabulary size", "eod": "end-of-document id"}
    differ = [label for key, label in names.items() if a[key] != b[key]]
    if differ:
        return "they differ in " + " and ".join(differ)
    files = "" if a["files"] == b["files"] else f" ({a['files']} against {b['files']})"
    return (
        "they have the same type, vocabulary size and end-of-document id but give other ids "
        f"for the same text: another vocabulary or merges{files} (the fingerprint is the "
        "SHA-256 of the vocabulary size, end-of-document id and the ids of a probe text)"
    )


def with_recorded_tokenizer(data: Any) -> Any:
    """``data`` (a ``DataConfig``) with ``tokenizer_type`` resolved (see the module docstring).

    Raises:
        ConfigError: prefixes recorded with different tokenizers, or a malformed record.
    """
    if data.tokenizer_type:
        return data
    records = recorded_tokenizers(data)
    if not records:
        return dataclasses.replace(data, tokenizer_type=DEFAULT_TOKENIZER)
    (first, record), *others = records.items()
    for prefix, other in others:
        if other["fingerprint"] != record["fingerprint"]:
            a, b = _recorded(record), _recorded(other)
            raise ConfigError(
                "data.data_path",
                f"mixes corpora preprocessed with different tokenizers: {first} with "
                f"{_describe(a)} ({record_path(first)}), {prefix} with {_describe(b)} "
                f"({record_path(prefix)}); {_differences(a, b)}; preprocess them with one "
                "tokenizer",
            )
    changes: dict[str, Any] = {"tokenizer_type": record["tokenizer_type"]}
    for name in ("vocab_file", "merge_file", "tokenizer_model", "vocab_extra_ids"):
        if name in OPTIONS and not getattr(data, name) and record.get(name):
            changes[name] = record[name]
    return dataclasses.replace(data, **changes)


def with_resolved_tokenizer(config: Any) -> Any:
    """``config`` (a ``TrainConfig``) whose ``data.tokenizer_type`` names the tokenizer used, so
    that the run's saved ``config.toml`` does: ESM-2's for ``model.type = "esm"``, else
    :func:`with_recorded_tokenizer`'s; a fine-tuning run's (``sft.train_file``)
    ``HuggingFaceTokenizer`` of its tokenizer folder."""
    sft = getattr(config, "sft", None)
    if sft is not None and sft.enabled:  # the folder the rows were tokenized with
        folder = sft.tokenizer or config.checkpoint.init_from
        data = dataclasses.replace(
            config.data, tokenizer_type="HuggingFaceTokenizer", tokenizer_model=folder
        )
        return dataclasses.replace(config, data=data)
    if config.data.tokenizer_type:
        return config
    if config.model.type == "esm":
        data = dataclasses.replace(config.data, tokenizer_type="ESM2Tokenizer")
    else:
        data = with_recorded_tokenizer(config.data)
    return dataclasses.replace(config, data=data)


def tokenizer_source(config: Any) -> str:
    """The options that name a ``TrainConfig``'s tokenizer, as text (``sft.tokenizer='F'``)."""
    sft, init = config.sft, config.checkpoint.init_from
    if sft.enabled:
        if sft.tokenizer:
            return f"sft.tokenizer={sft.tokenizer!r}"
        return f"the tokenizer in checkpoint.init_from={init!r}"
    d = with_resolved_tokenizer(config).data
    files = [
        f"data.{k}={getattr(d, k)!r}"
        for k in ("tokenizer_model", "vocab_file", "merge_file")
        if getattr(d, k, None)
    ]
    return " ".join([f"data.tokenizer_type={d.tokenizer_type!r}", *files])


def check_model_vocab(config: Any, tokenizer_vocab: int) -> None:
    """Refuse a ``model.vocab_size`` below the tokenizer's vocabulary, naming where each comes from.

    Args:
        config: the ``TrainConfig``.
        tokenizer_vocab: the tokenizer's number of ids (added tokens included).

    Raises:
        ConfigError: (``model.vocab_size``) the model's vocabulary (set, or the
            ``checkpoint.init_from`` model's) is smaller; names the tokenizer's option and
            what to change.
    """
    vocab = config.model.vocab_size
    if vocab is None or vocab >= tokenizer_vocab:
        return
    init = config.checkpoint.init_from
    model = f" (the model of checkpoint.init_from={init!r})" if init else ""
    if config.sft.enabled and config.sft.tokenizer and init and holds_tokenizer(init):
        fix = (
            "leave sft.tokenizer unset to use the tokenizer in checkpoint.init_from, or give "
            f"one of at most {vocab} ids"
        )
    elif config.sft.enabled:
        fix = f"give the model's own tokenizer (sft.tokenizer=FOLDER), of at most {vocab} ids"
    elif init:
        fix = f"give a tokenizer of at most {vocab} ids, or start from a model that has its ids"
    else:
        fix = f"give a tokenizer of at most {vocab} ids, or leave model.vocab_size unset"
    raise ConfigError(
        "model.vocab_size",
        f"must be >= the tokenizer's vocabulary size {tokenizer_vocab}, got {vocab}{model}; "
        f"the tokenizer is {tokenizer_source(config)}: {fix}",
    )


def effective_tokenizer_type(config: Any) -> str:
    """The canonical tokenizer type a ``TrainConfig`` trains with (``""`` resolved as the trainer does).

    So that ``""`` and the name it resolves to are the same run (a run's saved
    ``config.toml`` names the resolved one).
    """
    name = with_resolved_tokenizer(config).data.tokenizer_type
    return canonical_tokenizer_type(name) or name


def check_recorded_tokenizer(
    data: Any, tokenizer: Any, *, option: str = "data.tokenizer_type", fix: str = ""
) -> None:
    """Refuse ``tokenizer`` if a data-path prefix was preprocessed with another one.

    Args:
        data: the ``[data]`` section naming the prefixes.
        tokenizer: the tokenizer about to be used.
        option: the option the error names (``epochal generate``: ``--tokenizer-type``).
        fix: what to do instead (default: leave ``data.tokenizer_type`` unset, or set the
            recorded one).

    Raises:
        ConfigError: naming ``option``, the prefix's record and both tokenizers.
    """
    records = recorded_tokenizers(data)
    if not records:
        return
    given = _given(tokenizer)
    for prefix, record in records.items():
        if record["fingerprint"] != given["fingerprint"]:
            recorded = _recorded(record)
            files = [
                f"data.{k}={record[k]!r}"
                for k in ("vocab_file", "merge_file", "tokenizer_model")
                if record.get(k)
            ]
            advice = fix or (
                "leave data.tokenizer_type and its files unset to use the recorded one, or set "
                + " ".join([f"data.tokenizer_type={record['tokenizer_type']!r}", *files])
            )
            raise ConfigError(
                option,
                f"{prefix} was preprocessed with {_describe(recorded)} "
                f"({record_path(prefix)}), but the tokenizer given is {_describe(given)}; "
                f"{_differences(recorded, given)}; {advice}",
            )
