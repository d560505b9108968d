"""The samples a run's step trained on, rebuilt from the run's ``config.toml`` and its data.

Nothing about the samples is stored with a run: :func:`run_step_samples` reads the
resolved configuration the run saved, builds its train data as the trainer does (one
process; index caches are reused) and names the global samples of the step
(:mod:`epochal.train.inputs.sample_identity`). The digest it computes is the one the
trainer wrote in the step's ``metrics.jsonl`` record when the data is unchanged;
:attr:`RunStepSamples.recorded` is that record's digest, to compare. Relative data
paths in the configuration are read from the current folder, as the trainer did.

A scheduled blend (``data.blend_schedule``) is continued as the run's latest process
continued it: from the checkpoint it resumed from (the last ``segment`` record of
``metrics.jsonl``; the newest checkpoint when that one is gone), with the saved
revisions of the blend, so a schedule revised at a resume lists, for each step, the
samples the run drew there: the old schedule's before the resume point, the revised
one's after it (:meth:`~epochal.data.datasets.scheduled_blend.ScheduledBlendedDataset.resume`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epochal.data.datasets.scheduled_blend import (
    BlendScheduleChangeError,
    ScheduledBlendedDataset,
    find_blend,
)
from epochal.train.config import TrainConfig, config_from_saved
from epochal.train.inputs.gpt import sample_to_step
from epochal.train.inputs.loaders import build_data
from epochal.train.inputs.sample_identity import StepSamples, has_identities, step_samples
from epochal.train.observe.metrics import read_metrics
from epochal.train.state.checkpoint import Checkpointer

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


def _resume_point(run_dir: Path) -> Path | None:
    """The checkpoint the run's latest process resumed from, or None when it started fresh.

    The last ``segment`` record of ``metrics.jsonl`` names it; a folder since moved
    with the run (or removed by ``checkpoint.keep_last``) is looked up by name in
    ``run_dir/checkpoints``, else the newest checkpoint there stands in (it was saved
    after that resume, so it holds the blend as the run continued it). Without a
    ``metrics.jsonl``: the newest checkpoint, if any.
    """
    checkpoints = run_dir / "checkpoints"
    newest = Checkpointer(checkpoints).latest() if checkpoints.is_dir() else None
    try:
        segments = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "segment"]
    except FileNotFoundError:
        return newest
    if not segments:
        return newest
    recorded = segments[-1].get("resumed_from")
    if not recorded:
        return None
    for folder in (Path(recorded), checkpoints / Path(recorded).name):
        if (folder / "trainer_state.json").is_file():
            return folder
    return newest


def _continue_blend(dataset: Any, config: TrainConfig, run_dir: Path) -> None:
    """Give a scheduled blend the revisions the run trained with (see the module docstring).

    Raises:
        ValueError: the resume checkpoint's blend does not continue under the saved
            ``data.blend_schedule`` (names the checkpoint and the step).
    """
    blend = find_blend(dataset)
    if not isinstance(blend, ScheduledBlendedDataset):
        return
    folder = _resume_point(run_dir)
    if folder is None:
        return
    # only the JSON bookkeeping is read: listing samples does not verify the tensors' checksums
    state = Checkpointer(folder.parent, checksums=False).read_trainer_state(folder)
    consumed = int(state.get("consumed_train_samples", 0))
    try:
        blend.resume(state.get("blend"), consumed, sample_to_step(config))
    except BlendScheduleChangeError as exc:
        raise ValueError(
            f"{run_dir}/config.toml: its data.blend_schedule does not continue the blend of "
            f"checkpoint {folder} ({exc}); the run did not resume from there with this schedule"
        ) from None


def run_step_samples(run_dir: str | Path, step: int, *, log: Any = None) -> RunStepSamples:
    """The samples step ``step`` (1-based) of the run in ``run_dir`` reads.

    Args:
        run_dir: a run directory (its ``config.toml``; ``metrics.jsonl`` if any).
        step: the optimizer step.
        log: ``log(str)`` for data preparation messages (a corpus tokenized anew).

    Raises:
        FileNotFoundError: ``run_dir`` has no ``config.toml``.
        ConfigError: the saved configuration or its data cannot be used (names the option).
        CheckpointError: the checkpoint a scheduled blend continues from is malformed.
        ValueError: ``step < 1``, the train data does not name its samples, or the
            saved blend schedule does not continue the resume checkpoint's blend.
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
    _continue_blend(dataset, config, run_dir)
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
