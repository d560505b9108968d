"""GPT datasets for the trainer, from ``config.data``, through ``epochal.data``'s builder.

- ``data.corpus``: tokenized first (cached; :mod:`epochal.train.inputs.corpus`), then used
  as a single prefix split by ``data.split``;
- ``data.data_path`` / ``data.{train,valid,test}_data_path``: Megatron-style blends
  of indexed-file prefixes, with ``data.tokenizer_type``;
- ``data.mock``: Megatron's mock corpus (ids below ``model.vocab_size``, default 8192;
  end-of-document is the last id).

Sizes as Megatron computes them for the trainer: ``train_iters * global_batch_size``
training samples and ``eval_iters * global_batch_size`` validation samples (every
evaluation reads the same first samples); no test samples. Index caches go to
``<cache_dir>/gpt-index`` (hash-named, shared by runs with the same data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from epochal.data.datasets.blend_schedule import BlendSchedule
from epochal.data.datasets.dataset_builder import GPTDatasetConfig, parse_blend
from epochal.data.datasets.dataset_builder import build_gpt_datasets as build_datasets
from epochal.data.loading.microbatches import build_num_microbatches_calculator
from epochal.model.config import ConfigError
from epochal.train.config import DataConfig, TrainConfig
from epochal.train.inputs.corpus import default_cache_dir, prepare_corpus, tokenizer_from_config

__all__ = [
    "MOCK_VOCAB_SIZE",
    "blend_schedule_from_config",
    "build_gpt_datasets",
    "check_data_files",
    "missing_data_files",
    "sample_to_step",
]

MOCK_VOCAB_SIZE = 8192


_PATH_OPTIONS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def check_data_files(data: DataConfig) -> None:
    """Check that every prefix of the data paths has its ``.bin`` and ``.idx`` files.

    Cheap (two ``stat`` calls per prefix): ``epochal train`` runs it before
    launching processes or preparing anything, so a typo fails at once.

    Raises:
        ConfigError: naming the option (``data.data_path`` ...) and the missing file.
    """
    missing = missing_data_files(data)
    if missing:
        option, prefix, path = missing[0]
        raise ConfigError(
            option,
            f"{path} does not exist (prefix {prefix!r} needs {prefix}.bin and "
            f"{prefix}.idx, as written by epochal preprocess)",
        )


def missing_data_files(data: DataConfig) -> list[tuple[str, str, Path]]:
    """Every ``.idx`` / ``.bin`` file the data paths name that is not a file.

    Returns:
        ``(option, prefix, path)`` per missing file, in the order of the options
        (``data.data_path``, then the per-split paths) and of their prefixes.

    Raises:
        ConfigError: a blend that does not parse (naming the option).
    """
    missing = []
    for option in _PATH_OPTIONS:
        blend = parse_blend(getattr(data, option) or None, option)
        for prefix in blend[0] if blend else []:
            for ext in (".idx", ".bin"):
                path = Path(prefix + ext)
                if not path.is_file():
                    missing.append((f"data.{option}", prefix, path))
    return missing


def _step_samples(config: TrainConfig) -> Any:
    """Samples consumed before each step (ramp-up aware, whatever the data-parallel size)."""
    t = config.training
    return build_num_microbatches_calculator(
        t.global_batch_size, t.micro_batch_size, 1, t.rampup_batch_size
    )


def blend_schedule_from_config(config: TrainConfig) -> tuple[BlendSchedule, list[float]] | None:
    """``data.blend_schedule`` over global sample numbers, with its first point's weights.

    Step ``S`` of a point is the global sample consumed before step ``S + 1``:
    ``S * global_batch_size``, or under ``training.rampup_batch_size`` the samples of
    the first ``S`` steps of the ramp (the micro-batch calculator's count, which does
    not depend on the number of data-parallel ranks).

    Raises:
        ConfigError: (``data.blend_schedule``) a point the data layer rejects.
    """
    d = config.data
    if not d.blend_schedule:
        return None
    calc = _step_samples(config)
    steps = [int(p["step"]) for p in d.blend_schedule]
    points = [
        (calc.consumed_samples_after(s), list(p["weights"]))
        for s, p in zip(steps, d.blend_schedule)
    ]
    try:
        schedule = BlendSchedule(points, d.blend_schedule_interpolation, steps)
    except ValueError as exc:
        raise ConfigError("data.blend_schedule", str(exc)) from None
    return schedule, [float(w) for w in d.blend_schedule[0]["weights"]]


def sample_to_step(config: TrainConfig) -> Any:
    """``step_of(global sample)``: the (1-based) step whose global batch holds that sample."""
    calc = _step_samples(config)

    def step_of(sample: int) -> int:
        gbs = config.training.global_batch_size
        if config.training.rampup_batch_size is None:
            return sample // gbs + 1
        step = 0
        for first, _size in calc.iter_global_batches():
            if first > sample:
                return step
            step += 1
        return step  # pragma: no cover - the generator is endless

    return step_of


def build_gpt_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer or None, description)``.

    Args:
        config: the configuration (``data``, ``training.seed``/batch sizes/iterations).
        log: ``log(str)`` for progress messages.
        group: ``torch.distributed`` group whose rank 0 builds index caches first.

    Raises:
        ConfigError: no data source, a missing indexed file, or an option the data
            layer rejects (named ``data.<option>``).
        OSError: unreadable indexed files (named).
    """
    config.check_data()
    d, t = config.data, config.training
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    tokenizer = None
    paths: dict[str, list[str] | None] = {
        "data_path": d.data_path or None,
        "train_data_path": d.train_data_path or None,
        "valid_data_path": d.valid_data_path or None,
        "test_data_path": d.test_data_path or None,
    }
    if d.corpus:
        prepared = prepare_corpus(d, cache, log=log)
        tokenizer, vocab_size, eod = (
            prepared.tokenizer,
            prepared.tokenizer.vocab_size,
            prepared.tokenizer.eod,
        )
        paths = {"data_path": [prepared.prefix]}
        source = (
            f"{prepared.documents:,} documents, {prepared.tokens:,} tokens"
            f"{' (cached)' if prepared.cached else f' (prepared in {prepared.seconds:.1f} s)'} at {prepared.prefix}"
        )
    elif d.mock:
        vocab_size = config.model.vocab_size or MOCK_VOCAB_SIZE
        eod = vocab_size - 1
        paths = {}
        source = f"Megatron's mock GPT corpus (vocab {vocab_size})"
    else:
        check_data_files(d)
        tokenizer = tokenizer_from_config(d)
        vocab_size, eod = tokenizer.vocab_size, tokenizer.eod
        source = ", ".join(f"{k}={v}" for k, v in paths.items() if v)
    train_samples = t.train_iters * t.global_batch_size
    valid_samples = t.eval_iters * t.global_batch_size
    scheduled = blend_schedule_from_config(config)
    try:
        gcfg = GPTDatasetConfig(
            seq_length=d.seq_length,
            seed=t.seed,
            split=d.split,
            mock=d.mock and not d.corpus,
            vocab_size=vocab_size,
            path_to_cache=str(cache / "gpt-index"),
            reset_position_ids=d.reset_position_ids,
            reset_attention_mask=d.reset_attention_mask,
            eod_mask_loss=d.eod_mask_loss,
            create_attention_mask=d.reset_attention_mask,
            eod_token_id=eod,
            blend_schedule=scheduled[0] if scheduled else None,
            blend_schedule_weights=scheduled[1] if scheduled else None,
            **paths,
        )
        train, valid, _test = build_datasets(gcfg, [train_samples, valid_samples, 0], group=group)
    except ValueError as exc:
        raise ConfigError("data", str(exc)) from None
    if train is None:
        raise ConfigError("data.split", f"gives the train split no documents ({d.split!r})")
    if valid is not None and len(valid) == 0:
        valid = None
    description = (
        f"{source}; {train_samples:,} train samples (of {len(train):,} indexed)"
        + (
            f", {min(valid_samples, len(valid)):,} validation samples"
            if valid is not None
            else ", no validation"
        )
        + f", {d.seq_length} tokens each"
    )
    return train, valid, vocab_size, tokenizer, description
