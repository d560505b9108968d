"""Replay steps of a run in another layout and compare every record bit for bit.

``replay_step(run_dir, step)`` re-trains step ``N`` of a run from the newest
checkpoint before it (steps ``k + 1 .. N``; from the start when there is none),
with the run's own configuration and the layout the caller gives (one process
by default), in a fresh run directory, and compares:

- each replayed step's ``metrics.jsonl`` values (loss, gradient norm, learning
  rate, the sample digest, per-loss terms; not times, speed or memory) with the
  run's records of the same step (the last record of a step, as a resumed run
  logs steps twice), and the evaluation records of those steps;
- the weights after step ``N`` (the ``weight_digest`` of the replay's checkpoint,
  :mod:`epochal.train.state.weight_digest`) with the digest the run recorded in its
  checkpoint of step ``N``, where the run kept one.

The replay stops with ``training.exit_interval = N`` (the run's ``train_iters``
is kept: it shapes the learning-rate schedule and the dataset's index). A
run whose records are equal on every layout (``training.layout_invariant``)
replays as ``identical``; that is how one step of a large job is checked or
debugged on a workstation.

Errors: :class:`ReplayError` (a :class:`ValueError`) when the run directory
holds no configuration or metrics, the step is not one the run trained, or the
replay's training fails (its output's tail is in the message).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from epochal.train.observe.metrics import read_metrics
from epochal.train.state.checkpoint import TRAINER_STATE, Checkpointer
from epochal.train.state.weight_digest import KEY as WEIGHT_DIGEST

__all__ = ["ONE_PROCESS", "Comparison", "ReplayError", "ReplayResult", "replay_step"]

#: the layout a replay runs in unless the caller's overrides say otherwise
ONE_PROCESS = (
    "--parallel.tensor_parallel=1",
    "--parallel.sequence_parallel=false",
    "--parallel.context_parallel=1",
    "--parallel.expert_parallel=1",
    "--parallel.pipeline_parallel=1",
    "--parallel.virtual_pipeline=1",
    "--parallel.data_parallel=1",
    "--parallel.dp_sharding=none",
    "--parallel.nproc_per_node=0",
)


class ReplayError(ValueError):
    """A run that cannot be replayed at the step asked, or a replay that failed."""


@dataclass(frozen=True)
class Comparison:
    """One value of the run against the replay's (``equal``: the same bits)."""

    what: str
    run: object
    replay: object

    @property
    def equal(self) -> bool:
        a, b = self.run, self.replay
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return a == b


@dataclass
class ReplayResult:
    """What a replay compared.

    Attributes:
        run_dir: the run replayed.
        step: the step asked for (``N``).
        start: the checkpoint's step the replay resumed from (0: from the start).
        comparisons: every value compared, step by step, the weights last.
        weights_note: why the weights were not compared (None when they were).
    """

    run_dir: Path
    step: int
    start: int
    comparisons: list[Comparison] = field(default_factory=list)
    weights_note: str | None = None

    @property
    def identical(self) -> bool:
        return all(c.equal for c in self.comparisons)


def _last_records(path: Path, kind: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(path) if r.get("kind") == kind and "step" in r}


def _recorded_digest(folder: Path) -> str | None:
    state = json.loads((folder / TRAINER_STATE).read_text())
    digest = state.get(WEIGHT_DIGEST)
    return digest if isinstance(digest, str) else None


def _start_checkpoint(run_dir: Path, step: int) -> tuple[int, Path | None]:
    before = [(k, p) for k, p in Checkpointer(run_dir / "checkpoints").step_folders() if k < step]
    return before[-1] if before else (0, None)


def replay_step(
    run_dir: str | os.PathLike,
    step: int,
    overrides: list[str] | None = None,
    *,
    work_dir: str | os.PathLike | None = None,
) -> ReplayResult:
    """Replay step ``step`` of the run in ``run_dir``; see the module docstring.

    Args:
        run_dir: the run's directory (its ``config.toml``, ``metrics.jsonl``, checkpoints).
        step: the optimizer step to replay (1-based).
        overrides: ``--section.key=value`` options after :data:`ONE_PROCESS` (the
            layout to replay in, e.g. ``--parallel.tensor_parallel=2``).
        work_dir: the replay's run directory (kept); default a temporary one, removed.

    Raises:
        ReplayError: see the module docstring.
    """
    run_dir = Path(run_dir)
    config, metrics = run_dir / "config.toml", run_dir / "metrics.jsonl"
    for needed in (config, metrics):
        if not needed.is_file():
            raise ReplayError(f"{run_dir} is not a run directory: {needed.name} is missing")
    trained = _last_records(metrics, "train")
    if step < 1 or step not in trained:
        last = max(trained, default=0)
        raise ReplayError(
            f"{run_dir} has no record of step {step} (its metrics.jsonl records steps "
            f"1-{last}); give a step it trained"
        )
    start, folder = _start_checkpoint(run_dir, step)
    with tempfile.TemporaryDirectory(prefix="epochal-replay-") as scratch:
        target = Path(work_dir) if work_dir is not None else Path(scratch) / "run"
        command = [
            sys.executable,
            "-m",
            "epochal.cli",
            "train",
            "--config",
            str(config),
            *ONE_PROCESS,
            *(overrides or []),
            f"--run_dir={target}",
            f"--checkpoint.resume={folder if folder is not None else 'auto'}",
            f"--training.exit_interval={step}",
            "--checkpoint.save_interval=0",
            "--checkpoint.save_final=true",
            "--logging.progress=false",
            "--logging.tensorboard=false",
            "--logging.wandb=false",
        ]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            output = (proc.stdout + proc.stderr)[-4000:]
            raise ReplayError(
                f"replaying step {step} of {run_dir} failed (exit status {proc.returncode}):\n"
                f"{output}"
            )
        result = ReplayResult(run_dir, step, start)
        _compare_records(result, trained, _last_records(target / "metrics.jsonl", "train"))
        _compare_records(
            result,
            _last_records(metrics, "eval"),
            _last_records(target / "metrics.jsonl", "eval"),
            kind="eval",
        )
        _compare_weights(result, run_dir, target)
    return result


def _compare_records(
    result: ReplayResult, run: dict[int, dict], replay: dict[int, dict], kind: str = "train"
) -> None:
    for k in range(result.start + 1, result.step + 1):
        if kind == "eval" and k not in run:
            continue
        theirs, ours = run.get(k, {}), replay.get(k, {})
        for name in sorted(n for n in theirs if _is_value(n)):
            result.comparisons.append(
                Comparison(f"step {k} {kind} {name}", theirs.get(name), ours.get(name))
            )


#: keys of a metrics record that are not the run's values (times, speed, memory)
_NOT_VALUES = frozenset(
    {"kind", "segment", "step", "time", "tokens_per_s", "step_time_s", "tflops", "mfu"}
)


def _is_value(name: str) -> bool:
    return name not in _NOT_VALUES and not name.startswith(("mem_", "time_"))


def _compare_weights(result: ReplayResult, run_dir: Path, target: Path) -> None:
    steps = dict(Checkpointer(run_dir / "checkpoints").step_folders())
    if result.step not in steps:
        result.weights_note = f"the run kept no checkpoint of step {result.step}"
        return
    recorded = _recorded_digest(steps[result.step])
    if recorded is None:
        result.weights_note = f"the run's checkpoint of step {result.step} records no weight digest"
        return
    replayed = dict(Checkpointer(target / "checkpoints").step_folders()).get(result.step)
    ours = _recorded_digest(replayed) if replayed is not None else None
    result.comparisons.append(Comparison(f"weights after step {result.step}", recorded, ours))
