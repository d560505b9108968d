"""Reading a configuration (preset, TOML file, ``--section.key=value`` overrides) and
writing the resolved tree back as TOML."""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from epochal._checks import is_int, is_real, require
from epochal.model.config import ConfigError
from epochal.train.config.merge import deep_merge
from epochal.train.config.tree import TrainConfig

__all__ = [
    "EXCLUSIVE_OPTIONS",
    "build_config",
    "config_from_dict",
    "config_from_saved",
    "holds_tokenizer",
    "parse_overrides",
    "preset_gives_way",
    "sets_run_dir",
    "to_toml",
]


# ----------------------------------------------------------------- loading
def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, option: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widened to float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, option)
            except ConfigError as exc:
                errors.append(exc.detail)
        raise ConfigError(
            option, f"expected {' or '.join(_type_name(a) for a in args)}, got {value!r}"
        )
    if origin is Literal:
        allowed = typing.get_args(tp)
        require(value in allowed, option, f"must be one of {list(allowed)}, got {value!r}")
        return value
    if origin is dict:
        require(isinstance(value, dict), option, f"expected a table, got {value!r}")
        return dict(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        require(isinstance(value, list | tuple), option, f"expected a list, got {value!r}")
        return [_coerce(v, item_tp, option) for v in value]
    if dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), option, f"expected a table of options, got {value!r}")
        return _build_dataclass(tp, value, option)
    if tp is bool:
        require(isinstance(value, bool), option, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        require(is_int(value), option, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        require(is_real(value), option, f"expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        require(isinstance(value, str), option, f"expected a string, got {value!r}")
        return value
    return value


def _unknown_message(cls: type, key: str, prefix: str, known: list[str]) -> str:
    """``unknown option; did you mean ...?`` with the closest names (difflib) and where to list all."""
    from epochal.train.config.options import close_options

    everywhere: list[str] = []
    if not prefix:  # a key without its section (--train_iters=5): look at every option's name
        for name, tp in typing.get_type_hints(cls).items():
            if dataclasses.is_dataclass(tp):
                everywhere += [f"{name}.{g.name}" for g in dataclasses.fields(tp)]
    near = close_options(key, known, everywhere=everywhere)
    where = f"{prefix}." if prefix else ""
    named = [f"{where}{n}" if "." not in n else n for n in near]
    listing = f"epochal train --list-options {prefix}" if prefix else "epochal train --list-options"
    what = "unknown option" if prefix else "unknown section or option"
    if named:
        return f"{what}; did you mean {' or '.join(named)}? ({listing} lists them all)"
    return f"{what}; {listing} lists the known ones"


def _build_dataclass(cls: type, values: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in values.items():
        option = f"{prefix}.{key}" if prefix else key
        if key not in known:
            raise ConfigError(option, _unknown_message(cls, key, prefix, sorted(known)))
        kwargs[key] = _coerce(value, hints[key], option)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        option = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(option, f"is required (missing: {', '.join(missing)})")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise (
            exc.with_prefix(prefix) if prefix and not exc.option.startswith(prefix + ".") else exc
        ) from None


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    """Build and validate a :class:`TrainConfig` from nested dicts (TOML tables)."""
    return _build_dataclass(TrainConfig, values, "")


def config_from_saved(values: dict[str, Any]) -> TrainConfig:
    """Build a :class:`TrainConfig` from a ``config.toml`` a run saved (any version).

    Runs saved before the options of :data:`EXCLUSIVE_OPTIONS` became exclusive may
    hold two of a group; they were resolved by precedence then, and are read the
    same way here: ``data.corpus`` over ``data.mock`` over the paths, and
    ``scheduler.lr_warmup_fraction`` over ``lr_warmup_iters``.

    Raises:
        ConfigError: as :func:`config_from_dict`.
    """
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    data, sched = values.get("data"), values.get("scheduler")
    if isinstance(data, dict) and (data.get("corpus") or data.get("mock")):
        for key in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
            data.pop(key, None)
        if data.get("corpus"):
            data.pop("mock", None)
    if isinstance(sched, dict) and sched.get("lr_warmup_fraction") is not None:
        sched["lr_warmup_iters"] = 0
    return config_from_dict(values)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["--a.b=1", "c.d=x"]`` into ``{"a": {"b": 1}, "c": {"d": "x"}}``.

    Values are TOML literals; a value that does not parse as TOML is a string.
    Dashes in keys are read as underscores (``--training.train-iters=5``).

    Raises:
        ConfigError: an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        key, sep, raw = text.partition("=")
        key = key.strip().replace("-", "_")  # --run-dir, --training.train-iters
        require(bool(sep) and bool(key), item, "overrides look like --section.key=value")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            require(isinstance(node, dict), key, "conflicts with another override")
        node[parts[-1]] = value
    return out


# Options of which a configuration sets at most one. An option set explicitly (in the
# config file or an override) removes the preset's values of the others in its group,
# so ``--data.data_path=[...]`` replaces the tiny preset's ``data.corpus``,
# ``--scheduler.lr_warmup_iters=5`` its ``scheduler.lr_warmup_fraction`` and
# ``--sft.valid_file=F`` the sft-tiny preset's ``sft.split``.
EXCLUSIVE_OPTIONS: tuple[tuple[str, ...], ...] = (
    (
        "data.corpus",
        "data.mock",
        "data.data_path",
        "data.train_data_path",
        "data.valid_data_path",
        "data.test_data_path",
        "data.protein_path",
        "data.train_cluster_path",
        "data.train_database_path",
        "data.valid_cluster_path",
        "data.valid_database_path",
        "sft.train_file",
    ),
    ("scheduler.lr_warmup_iters", "scheduler.lr_warmup_fraction"),
    ("sft.split", "sft.valid_file"),
)


def _has_option(values: dict[str, Any], dotted: str) -> bool:
    section, _, key = dotted.rpartition(".")
    table = values.get(section) if section else values
    return isinstance(table, dict) and key in table


def holds_tokenizer(folder: str) -> bool:
    """Whether ``folder`` holds a Hugging Face tokenizer (``tokenizer.json`` / ``tokenizer_config.json``)."""
    return any(
        (Path(folder) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    )


def preset_gives_way(
    preset: dict[str, Any], explicit: dict[str, Any], *, from_checkpoint: bool = False
) -> list[str]:
    """Drop from ``preset`` (in place) the values that the ``explicit`` options contradict.

    - Of each group of :data:`EXCLUSIVE_OPTIONS`, an explicit option drops the
      preset's others; a preset whose ``sft.train_file`` is dropped loses its whole
      ``[sft]`` section (another data source replaced its rows).
    - ``from_checkpoint`` (the ``[model]`` comes from ``checkpoint.init_from``): the
      preset's ``[model]`` but :data:`~epochal.train.config.model.CHECKPOINT_KEPT_FIELDS`,
      and its ``sft.tokenizer`` when the explicit ``checkpoint.init_from`` folder holds a
      tokenizer (``sft.tokenizer = ""`` is then that one).

    Args:
        preset: the preset's nested values (changed).
        explicit: the file's and the overrides' nested values.
        from_checkpoint: see above.

    Returns:
        One phrase per dropped value (``sft.split = "90,10" (sft.valid_file is set)``).
    """
    from epochal.train.config.model import CHECKPOINT_KEPT_FIELDS

    notes: list[str] = []
    replaced_rows = ""
    for group in EXCLUSIVE_OPTIONS:
        given = [o for o in group if _has_option(explicit, o)]
        if not given:
            continue
        for option in group:
            if _has_option(preset, option) and not _has_option(explicit, option):
                section, _, key = option.rpartition(".")
                value = preset[section].pop(key)
                if option == "sft.train_file":
                    replaced_rows = given[0]
                else:
                    notes.append(f"{option} = {_toml_value(value)} ({given[0]} is set)")
    if replaced_rows and isinstance(preset.get("sft"), dict):
        del preset["sft"]
        notes = [n for n in notes if not n.startswith("sft.")]
        notes.append(f"[sft] ({replaced_rows} is set)")
    init = (explicit.get("checkpoint") or {}).get("init_from")
    if from_checkpoint and isinstance(preset.get("model"), dict):
        model = preset["model"]
        dropped = [k for k in list(model) if k not in CHECKPOINT_KEPT_FIELDS]
        for key in dropped:
            del model[key]
        if dropped:
            notes.append(f"[model] (checkpoint.init_from={_toml_value(str(init))} sets it)")
    sft = preset.get("sft")
    if (
        from_checkpoint
        and isinstance(sft, dict)
        and sft.get("tokenizer")
        and not _has_option(explicit, "sft.tokenizer")
        and isinstance(init, str)
        and holds_tokenizer(init)
    ):
        value = sft.pop("tokenizer")
        notes.append(
            f"sft.tokenizer = {_toml_value(value)} (checkpoint.init_from holds a tokenizer)"
        )
    return notes


def _fit_positions(merged: dict[str, Any], explicit: dict[str, Any]) -> list[str]:
    """A GPT's ``data.seq_length`` left unset, cut to the checkpoint's ``max_position_embeddings``.

    ``merged`` is changed in place; returns the phrase saying so, or nothing.
    """
    from epochal.train.config.data import DataConfig

    model, data = merged.get("model") or {}, merged.setdefault("data", {})
    positions = model.get("max_position_embeddings")
    if model.get("type", "gpt") != "gpt" or not isinstance(positions, int):
        return []
    if _has_option(explicit, "data.seq_length"):
        return []
    default = next(f.default for f in dataclasses.fields(DataConfig) if f.name == "seq_length")
    length = data.get("seq_length", default)
    if not isinstance(length, int) or length <= positions:
        return []
    data["seq_length"] = positions
    return [
        f"data.seq_length = {positions}, the positions of checkpoint.init_from's model "
        f"({length} would exceed them)"
    ]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path),
            f"not a TOML text file (byte {exc.start} is 0x{exc.object[exc.start]:02x}, "
            "not UTF-8); --config takes a .toml file",
        ) from None
    except OSError as exc:
        raise ConfigError(
            str(path), f"cannot read the config file: {exc.strerror or exc}"
        ) from None


def _resolve(preset_values: dict[str, Any], explicit: dict[str, Any]) -> TrainConfig:
    values = copy.deepcopy(preset_values)
    preset_gives_way(values, explicit)
    return config_from_dict(deep_merge(values, explicit))


def build_config(
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    require_data: bool = True,
    init_model: list[str] | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainConfig:
    """Resolve a configuration: preset, then TOML file, then overrides.

    A preset's values are defaults: options set in the file or the overrides are
    explicit and win, and a preset value that an explicit option contradicts is
    dropped (:func:`preset_gives_way`; ``log`` gets one line naming each): one of a
    group in :data:`EXCLUSIVE_OPTIONS` replaces the preset's others (an explicit
    ``data.data_path`` wins over the preset's ``data.corpus``, ``sft.valid_file`` over
    its ``sft.split``); two set explicitly are an error naming both. With
    ``init_model`` the model comes from ``checkpoint.init_from`` (as TRL's
    ``SFTTrainer(model=...)`` takes it): the preset's ``[model]`` gives way to it (but
    for the head, LoRA and dropout fields), its ``sft.tokenizer`` to a tokenizer the
    folder holds, and a ``data.seq_length`` the file and the overrides leave unset
    is at most the model's ``max_position_embeddings``.

    Without an explicit ``run_dir`` the run directory is derived from what the run
    is (:func:`~epochal.train.config.run_name.default_run_dir`): ``runs/<preset>``,
    ``runs/<config file name>``, with ``-<hash>`` when overrides change options that
    define the run.

    Args:
        preset: a name from :data:`epochal.train.config.presets.PRESETS` (None = defaults).
        config_file: a TOML file.
        overrides: ``--section.key=value`` strings.
        require_data: require a data source (:meth:`TrainConfig.check_data`); False
            to resolve a configuration only to show it.
        init_model: the ``--model.*`` overrides giving the run the model of its
            ``checkpoint.init_from``
            (:func:`~epochal.train.state.encoder_init.finetune_overrides`); between the
            file and ``overrides``.
        log: gets the line saying which preset values gave way, when any did.

    Raises:
        ConfigError: unknown key or invalid value (names the option); a config file
            that is not UTF-8 TOML or cannot be read (names the file).
        FileNotFoundError: the config file is missing (names it).
    """
    from epochal.train.config.presets import preset_dict
    from epochal.train.config.run_name import default_run_dir

    preset_values: dict[str, Any] = preset_dict(preset) if preset else {}
    from_file: dict[str, Any] = _read_toml(Path(config_file)) if config_file is not None else {}
    explicit = from_file
    if init_model is not None:
        explicit = deep_merge(explicit, parse_overrides(init_model))
    if overrides:
        explicit = deep_merge(explicit, parse_overrides(overrides))
    values = copy.deepcopy(preset_values)
    notes = preset_gives_way(values, explicit, from_checkpoint=init_model is not None)
    merged = deep_merge(values, explicit)
    if init_model is not None:
        notes += _fit_positions(merged, explicit)
    config = config_from_dict(merged)
    if notes and log is not None:
        by = f"preset {preset}'s values" if preset else "the built-in defaults"
        log(f"{by} give way to the options given: {'; '.join(notes)}")
    if "run_dir" not in explicit:
        try:
            base = _resolve(preset_values, from_file) if explicit is not from_file else config
        except ConfigError:  # the file is valid only with the overrides: hash every option
            base = None
        config.run_dir = default_run_dir(config, preset=preset, config_file=config_file, base=base)
    if require_data:
        config.check_data()
    return config


def sets_run_dir(config_file: str | Path | None, overrides: list[str] | None) -> bool:
    """Whether the file or the overrides set ``run_dir`` (else :func:`build_config` derives it).

    Raises:
        ConfigError, FileNotFoundError: as :func:`build_config`.
    """
    if overrides and "run_dir" in parse_overrides(overrides):
        return True
    return config_file is not None and "run_dir" in _read_toml(Path(config_file))


# ------------------------------------------------------------------ writing
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            repr(v)
            if math.isfinite(v)
            else ("inf" if v > 0 else "-inf")
            if not math.isnan(v)
            else "nan"
        )
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{" + ", ".join(f"{_toml_value(str(k))} = {_toml_value(x)}" for k, x in v.items()) + "}"
        )
    raise TypeError(f"cannot write {v!r} to TOML")


def to_toml(config: TrainConfig, *, pin_run_dir: bool = True) -> str:
    """The resolved configuration as TOML (``None`` values omitted); :func:`build_config` reads it back.

    Args:
        config: the configuration.
        pin_run_dir: write ``run_dir``; False writes it as a comment, so that training
            the file derives its own (``runs/<file name>``) instead of sharing this one.
    """
    lines: list[str] = []
    tables: list[tuple[str, Any]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            tables.append((f.name, value))
        elif f.name == "run_dir" and not pin_run_dir:
            lines.append(
                f"# run_dir = {_toml_value(value)}  # unset: --config FILE trains in "
                "runs/<FILE's name>; set it to choose"
            )
        elif value is not None:
            lines.append(f"{f.name} = {_toml_value(value)}")
    for name, section in tables:
        lines.append("")
        lines.append(f"[{name}]")
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if value is not None:
                lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
