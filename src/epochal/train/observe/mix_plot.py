"""Plot the realised blend mix of a run: the share of each source per step, from the ledger.

Every train record of a blended run carries ``"sources"``, the samples each source
served in that step (:mod:`epochal.train.observe.data_records`). :func:`realised_mix`
reads them back (a step recorded again by a resume counts once, its latest record
wins) and :func:`plot_mix` draws the shares as stacked areas over the steps, smoothed
by a running sum over ``smooth`` steps, with the cumulative share of each source
since step 1 as dashed lines; a resume is marked by a dotted vertical line.
"""

from __future__ import annotations

import os
from pathlib import Path

from epochal.train.observe.metrics import read_metrics

__all__ = ["plot_mix", "realised_mix"]


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
        names: the sources' labels (default ``source 0``, ``source 1``, ...).

    Raises:
        FileNotFoundError: no ``metrics.jsonl``.
        ValueError: the run recorded no ledger.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import numpy as np

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
    labels = names or [f"source {s}" for s in range(served.shape[1])]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    ax.stackplot(steps, shares.T, labels=labels, alpha=0.75)
    bottom = np.zeros(len(steps))
    for s in range(served.shape[1]):
        bottom = bottom + cumulative[:, s]
        ax.plot(steps, bottom, color="black", lw=0.8, ls="--", alpha=0.6)
    for x in resumes:
        ax.axvline(x - 0.5, color="gray", ls=":", lw=1)
    ax.set_xlim(steps[0], steps[-1])
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the step's samples" + (f" (over {window} steps)" if window > 1 else ""))
    ax.set_title(f"{run.resolve().name}: realised mix (dashed: cumulative)")
    ax.legend(loc="upper left", fontsize=8)
    from epochal.train.observe.plot import save_figure

    return save_figure(fig, Path(output) if output is not None else run / "mix.png")
