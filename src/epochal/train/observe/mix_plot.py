"""Plot the realised blend mix of a run: the share of each source per step, from the ledger.

Every train record of a blended run carries ``"sources"``, the samples each source
served in that step (:mod:`epochal.train.observe.data_records`). :func:`realised_mix`
reads them back (a step recorded again by a resume counts once, its latest record
wins) and :func:`plot_mix` draws the shares as stacked areas over the steps, smoothed
by a running sum over ``smooth`` steps, with the cumulative share of each source
since step 1 as dashed lines; a resume is marked by a dotted vertical line.

Step ``s``'s share is drawn flat over ``[s - 1, s]`` (``drawstyle="steps-post"``), so
a schedule point at step ``S``, in force from step ``S + 1``, is a vertical jump at
``S`` (with ``smooth`` 1, the default for runs under 100 steps). The legend names
each source by its data path's last component (the whole path where two share it),
read from the run's ``config.toml``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from epochal.data.datasets.dataset_builder import parse_blend
from epochal.train.observe.metrics import read_metrics

__all__ = ["plot_mix", "realised_mix", "source_names"]


def source_names(run_dir: str | os.PathLike, count: int) -> list[str]:
    """The labels of a blended run's ``count`` sources, in the order of its blend.

    The prefixes of ``data.train_data_path`` (or ``data.data_path``) in the run's
    ``config.toml``, each by its last path component, or whole where two share one;
    ``source 0``, ``source 1``, ... when the configuration names no blend of ``count``.
    """
    fallback = [f"source {s}" for s in range(count)]
    try:
        data = tomllib.loads((Path(run_dir) / "config.toml").read_text(encoding="utf-8"))["data"]
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return fallback
    for option in ("train_data_path", "data_path"):
        try:
            blend = parse_blend(data.get(option) or None, option)
        except (ValueError, TypeError):
            continue
        if blend is not None and len(blend[0]) == count:
            short = [os.path.basename(p.rstrip("/\\")) or p for p in blend[0]]
            return short if len(set(short)) == count else list(blend[0])
    return fallback


def realised_mix(records: list[dict]) -> tuple[list[int], list[list[int]], list[int]]:
    """``(steps, counts[step][source], resume steps)`` of the train records with a ledger.

    Raises:
        ValueError: no train record has ``"sources"`` (not a blended run).
    """
    by_step: dict[int, list[int]] = {}
    segment_of: dict[int, int] = {}
    for r in records:
        if r["kind"] == "train" and isinstance(r.get("sources"), list):
            by_step[r["step"]] = [int(c) for c in r["sources"]]
            segment_of[r["step"]] = r.get("segment", 0)
    if not by_step:
        raise ValueError("no train record has a blend ledger ('sources'): not a blended run")
    steps = sorted(by_step)
    resumes = [s for a, s in zip(steps, steps[1:]) if segment_of[s] != segment_of[a]]
    return steps, [by_step[s] for s in steps], resumes


def plot_mix(
    run_dir: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    smooth: int = 0,
    names: list[str] | None = None,
) -> Path:
    """Write the realised-mix plot of ``run_dir`` (default ``<run_dir>/mix.png``).

    Args:
        smooth: steps per running window (0: about 1/50 of the run, at least 1).
        names: the sources' labels (default :func:`source_names`).

    Raises:
        FileNotFoundError: no ``metrics.jsonl``.
        ValueError: the run recorded no ledger.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    run = Path(run_dir)
    steps, counts, resumes = realised_mix(read_metrics(run / "metrics.jsonl"))
    served = np.asarray(counts, dtype=np.float64)  # [steps, sources]
    window = smooth or max(1, len(steps) // 50)
    kernel = np.ones(window)
    summed = np.stack(
        [np.convolve(served[:, s], kernel)[: len(steps)] for s in range(served.shape[1])], axis=1
    )
    shares = summed / np.maximum(summed.sum(axis=1, keepdims=True), 1)
    cumulative = np.cumsum(served, axis=0)
    cumulative /= np.maximum(cumulative.sum(axis=1, keepdims=True), 1)
    labels = names or source_names(run, served.shape[1])
    # step s over [s - 1, s]: the edges, the last step's values repeated at the right end
    x = [s - 1 for s in steps] + [steps[-1]]
    shares = np.vstack([shares, shares[-1:]])
    cumulative = np.vstack([cumulative, cumulative[-1:]])
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    areas = ax.stackplot(x, shares.T, labels=labels, alpha=0.75, step="post")
    top, bottom = np.zeros(len(x)), np.zeros(len(x))
    for s in range(served.shape[1]):
        top = top + shares[:, s]
        color = areas[s].get_facecolor()[0][:3]
        ax.plot(x, top, color=color, lw=0.8, drawstyle="steps-post")
        bottom = bottom + cumulative[:, s]
        ax.plot(x, bottom, color="black", lw=0.8, ls="--", alpha=0.6, drawstyle="steps-post")
    for first in resumes:
        ax.axvline(first - 1, color="gray", ls=":", lw=1)
    ax.set_xlim(x[0], x[-1])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the step's samples" + (f" (over {window} steps)" if window > 1 else ""))
    ax.set_title(f"{run.resolve().name}: realised mix (dashed: cumulative)")
    ax.legend(loc="upper left", fontsize=8)
    from epochal.train.observe.plot import save_figure

    return save_figure(fig, Path(output) if output is not None else run / "mix.png")
