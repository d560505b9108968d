"""Plot a run's loss curves to PNG: train and validation loss, resumed segments overlaid.

Segment 0 (the first process) is drawn as a solid line; every resumed segment
is drawn on top of it as a dashed line in its own colour (with a marker per step
when it is short), so a resume that continues exactly lies on the earlier line.
The step axis ticks whole steps only. Training loss
is also drawn smoothed (a running mean) when the run is long. For multi-epoch
data (records of kind ``epoch``, :mod:`epochal.train.inputs.epoch_evidence`) every epoch after
the first is marked by a dotted vertical line labelled "epoch N" where its first
sample is consumed.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from epochal._atomic import atomic_path
from epochal.train.observe.metrics import read_metrics

__all__ = ["epoch_marks", "plot_run"]

#: a resumed segment of at most this many steps also marks each step
_MARKED_STEPS = 20


def plot_run(
    run_dir: str | os.PathLike, output: str | os.PathLike | None = None, *, smooth: int = 0
) -> Path:
    """Write the loss plot of ``run_dir``.

    Args:
        run_dir: a run directory with ``metrics.jsonl``.
        output: the PNG path (default ``<run_dir>/loss.png``); written then renamed.
        smooth: running-mean window for training loss (0 = automatic: 1 for short
            runs, about 1/50 of the steps otherwise).

    Returns:
        The PNG path.

    Raises:
        FileNotFoundError: no ``metrics.jsonl`` in ``run_dir``.
        ValueError: the metrics hold no training step.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    run = Path(run_dir)
    records = read_metrics(run / "metrics.jsonl")
    train: dict[int, list[tuple[int, float]]] = defaultdict(list)
    evals: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for r in records:
        if r["kind"] == "train":
            train[r["segment"]].append((r["step"], r["loss"]))
        elif r["kind"] == "eval":
            evals[r["segment"]].append((r["step"], r["loss"]))
    if not train:
        raise ValueError(f"{run / 'metrics.jsonl'}: no training steps recorded")
    n_steps = max(s for pts in train.values() for s, _ in pts)
    window = smooth or max(1, n_steps // 50)

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for seg in sorted(train):
        pts = sorted(train[seg])
        steps, losses = [p[0] for p in pts], [p[1] for p in pts]
        color = colors[seg % len(colors)]
        label = "train" if seg == 0 else f"train (resumed, segment {seg})"
        if seg == 0:
            ax.plot(
                steps, losses, color=color, alpha=0.35 if window > 1 else 1.0, lw=1, label=label
            )
            if window > 1:
                ax.plot(
                    steps,
                    _running_mean(losses, window),
                    color=color,
                    lw=2,
                    label=f"train (mean of {window})",
                )
        else:
            marker = "o" if len(steps) <= _MARKED_STEPS else None
            ax.plot(steps, losses, color=color, lw=1.2, ls="--", marker=marker, ms=3, label=label)
    for seg in sorted(evals):
        pts = sorted(evals[seg])
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            color="black" if seg == 0 else colors[seg % len(colors)],
            marker="s" if seg == 0 else "x",
            ms=6,
            lw=1.5,
            ls="-" if seg == 0 else "--",
            label="validation" if seg == 0 else f"validation (segment {seg})",
        )
    for x, label in epoch_marks(records):
        ax.axvline(x, color="gray", ls=":", lw=1)
        ax.annotate(
            label,
            (x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2),
            textcoords="offset points",
            rotation=90,
            va="top",
            fontsize=7,
            color="gray",
        )
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # no half steps on short runs
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"{run.resolve().name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, Path(output) if output is not None else run / "loss.png")


def save_figure(fig, out: Path) -> Path:
    """Write ``fig`` to ``out`` (PNG) whole or not at all, close it, and return ``out``.

    The folder is made if missing; the file is written to a temporary name and renamed.
    """
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return out


def epoch_marks(records: list[dict]) -> list[tuple[float, str]]:
    """``(x, "epoch N")`` for every epoch start after the first (N counts from 1).

    ``x`` is the fractional step at which the epoch's first sample is consumed,
    interpolated in the global batch of its step (the step itself when the train
    records lack ``consumed_samples``). Records repeated by a resume count once.
    """
    starts: dict[int, dict] = {}
    consumed: dict[int, int] = {}
    for r in records:
        if r["kind"] == "train" and "consumed_samples" in r:
            consumed[r["step"]] = r["consumed_samples"]
        elif r["kind"] == "epoch":
            starts[r["epoch"]] = r
    marks = []
    for k in sorted(starts):
        if k == 0:
            continue
        step = starts[k]["step"]
        after, before = consumed.get(step), consumed.get(step - 1, 0)
        x = float(step)
        if after is not None and after > before:
            x = step - 1 + (starts[k]["first_sample"] - before) / (after - before)
        marks.append((x, f"epoch {k + 1}"))
    return marks


def _running_mean(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out
