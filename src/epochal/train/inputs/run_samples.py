"""The samples a run's step trained on, rebuilt from the run's ``config.toml`` and its data.

Nothing about the samples is stored with a run: :func:`run_step_samples` reads the
resolved configuration the run saved, builds its train data as the trainer does (one
process; index caches are reused) and names the global samples of the step
(:mod:`epochal.train.inputs.sample_identity`). The digest it computes is the one the
trainer wrote in the step's ``metrics.jsonl`` record when the data is unchanged;
:attr:`RunStepSamples.recorded` is that record's digest, to compare. Relative data
paths in the configuration are read from the current folder, as the trainer did.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.train.config import config_from_saved
from epochal.train.inputs.loaders import build_data
from epochal.train.inputs.sample_identity import StepSamples, has_identities, step_samples
from epochal.train.observe.metrics import read_metrics

__all__ = ["RunStepSamples", "format_identity", "run_step_samples"]


@dataclass
class RunStepSamples:
    """The samples of one step of a run.

    Attributes:
        run_dir: the run directory.
        description: the train data, in words (as ``epochal train`` prints it).
        samples: the step's first global sample, identities and digest.
        recorded: the digest the run wrote for the step in ``metrics.jsonl`` (its latest
            record of the step), or None when it has none (not trained yet, older run).
        details: per sample, what the data adds for listings (``sample_details``; ESM-2:
            the member drawn), not part of the digest; empty dicts without.
    """

    run_dir: Path
    description: str
    samples: StepSamples
    recorded: str | None
    details: list[dict[str, Any]]


def _recorded_digest(run_dir: Path, step: int) -> str | None:
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
    except FileNotFoundError:
        return None
    found = [r for r in records if r.get("kind") == "train" and r.get("step") == step]
    return found[-1].get("sample_digest") if found else None


def run_step_samples(run_dir: str | Path, step: int, *, log: Any = None) -> RunStepSamples:
    """The samples step ``step`` (1-based) of the run in ``run_dir`` reads.

    Args:
        run_dir: a run directory (its ``config.toml``; ``metrics.jsonl`` if any).
        step: the optimizer step.
        log: ``log(str)`` for data preparation messages (a corpus tokenized anew).

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.toml``.
        ConfigError: the saved configuration or its data cannot be used (names the option).
        ValueError: ``step < 1``, or the train data does not name its samples.
        IndexError: the step lies beyond the train data (names the sizes).
    """
    run_dir = Path(run_dir)
    path = run_dir / "config.toml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.toml)")
    config = config_from_saved(tomllib.loads(path.read_text(encoding="utf-8")))
    config = dataclasses.replace(config, run_dir=str(run_dir))
    if step < 1:
        raise ValueError(f"--step must be >= 1, got {step}")
    data = build_data(config, log=log)
    dataset = data.train_loader.dataset
    if not has_identities(dataset):
        raise ValueError(f"the train data of {run_dir} ({type(dataset).__name__}) names no samples")
    samples = step_samples(dataset, data.sampler.calculator, step)
    more = getattr(dataset, "sample_details", None)
    stop = samples.first + len(samples.identities)
    details = [more(g) if more is not None else {} for g in range(samples.first, stop)]
    recorded = _recorded_digest(run_dir, step)
    return RunStepSamples(run_dir, data.description, samples, recorded, details)


def _value(value: Any) -> str:
    """``[[doc, start, end], ...]`` -> ``"doc[start:end] ..."``; ``[a, b]`` -> ``"a-b"``."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        return " ".join(f"{v[0]}[{v[1]}:{v[2]}]" for v in value)
    if isinstance(value, list) and len(value) == 2:
        return f"{value[0]}-{value[1]}"
    return str(value)


def format_identity(identity: dict[str, Any]) -> dict[str, str]:
    """An identity's values as text: token ranges as ``doc[start:end]``, spans as ``first-last``."""
    return {key: _value(value) for key, value in identity.items()}
