"""Megatron-Core's greedy blend of two datasets in closed form (exact, no step-by-step scan).

With two datasets the greedy rule (see :mod:`epochal.data.datasets.blended_dataset`) has a
one-dimensional state: the samples ``c`` taken from dataset 1 before step ``t`` (dataset 0
has taken ``t - c``). For ``t >= 1`` dataset 1 wins step ``t`` exactly when ``c < u[t]``,
where ``u[t]`` is the least count at which it loses (Megatron's float comparison only gets
less true as ``c`` grows). With weights summing to 1 the comparison's real threshold is
``w1 * t`` up to ``t * 2**-50``, so it holds at every count below ``m = rint(fl(w1 * t))``
and fails at every count above: ``u[t]`` is ``m``, plus one if dataset 1 still wins with
``m`` -- one evaluation of Megatron's own comparison per step, which settles near-ties the
way its floats do. The recurrence ``c[t + 1] = c[t] + (c[t] < u[t])`` then gives
``c[t + 1] = u[t]`` wherever ``u[t] - c[t]`` is 0 or 1, which is checked for every step
(``u`` rises by at most one per step, as ``w1 <= 1``); where it fails the recurrence is run
step by step until it meets ``u`` again. So every pick is Megatron's, while a step costs
about eighteen vectorized operations on cache-sized blocks and no Python.
"""

from __future__ import annotations

import numpy as np

#: Steps per block: large enough to amortize numpy's call overhead, small enough for the L2 cache.
_BLOCK = 1 << 14
#: Largest blend the closed form takes (counts and steps stay exact in float64 with room to spare).
MAX_SIZE = 1 << 40


def applies(w: np.ndarray, size: int) -> bool:
    """Whether :func:`two_dataset_blend` serves weights ``w`` (two, normalized) for ``size`` samples."""
    if w.shape != (2,) or not 0 <= size <= MAX_SIZE:
        return False
    w0, w1 = float(w[0]), float(w[1])
    return w0 >= 0.0 and w1 >= 0.0 and abs((w0 + w1) - 1.0) <= 2.0**-50


def two_dataset_blend(w: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's greedy blend of ``size`` samples over two datasets with weights ``w``.

    Args:
        w: float64 ``[2]``, non-negative, summing to 1 (see :func:`applies`).
        size: samples of the blend.

    Returns:
        ``(dataset_index, dataset_sample_index)``: int16 and int64 ``[size]``.
    """
    w0, w1 = float(w[0]), float(w[1])
    dataset_index = np.empty(size, dtype=np.int16)
    sample_index = np.empty(size, dtype=np.int64)
    if size == 0:
        return dataset_index, sample_index
    first = 1.0 if w1 * 1.0 > w0 * 1.0 else 0.0  # step 0 is compared at t = 1
    dataset_index[0] = first
    sample_index[0] = 0
    block = min(_BLOCK, size)
    offsets = np.arange(block, dtype=np.float64)
    t_buf, a_buf, b_buf, x_buf, y_buf, s_buf = (np.empty(block) for _ in range(6))
    wins_at = np.empty(block, dtype=bool)
    counts = np.empty(block + 1)  # counts[j]: dataset 1's samples used before step lo + j
    counts[0] = first
    for lo in range(1, size, block):
        n = min(block, size - lo)
        t = np.add(offsets[:n], float(lo), out=t_buf[:n])
        ideal = np.multiply(t, w1, out=a_buf[:n])  # Megatron's w1 * t and w0 * t
        other = np.multiply(t, w0, out=b_buf[:n])
        c = counts[: n + 1]
        u = np.rint(ideal, out=c[1:])  # m, then u[t] = m + (dataset 1 wins with m used)
        error1 = np.subtract(ideal, u, out=x_buf[:n])
        error0 = np.subtract(t, u, out=y_buf[:n])  # dataset 0's count if dataset 1 has m
        np.subtract(other, error0, out=error0)
        u += np.greater(error1, error0, out=wins_at[:n])
        prev = c[:-1]
        wins = np.subtract(c[1:], prev, out=s_buf[:n])  # 1 where dataset 1 wins step t
        if wins.min() < 0.0 or wins.max() > 1.0:  # the chain c[t + 1] = u[t] breaks there
            _follow_recurrence(c, int(np.flatnonzero((wins < 0.0) | (wins > 1.0))[0]))
            np.subtract(c[1:], prev, out=wins)
        dataset_index[lo : lo + n] = wins
        # the winner's sample: c if dataset 1 wins, else t - c (dataset 0's count)
        sample = np.subtract(t, prev, out=x_buf[:n])
        shift = np.subtract(prev, sample, out=y_buf[:n])
        shift *= wins
        sample += shift
        sample_index[lo : lo + n] = sample
        counts[0] = c[n]
    return dataset_index, sample_index


def _follow_recurrence(c: np.ndarray, i: int) -> None:
    """Replace ``c[i + 1:]`` (holding ``u``) by the recurrence ``c[j + 1] = c[j] + (c[j] < u[j])``.

    ``c[: i + 1]`` is exact. Runs to the block's end (the next block's first step is checked
    against the corrected count). Weights summing to 1 never get here (``u`` rises by 0 or 1
    per step); it keeps the result exact whatever the rounding does.
    """
    count = float(c[i])
    for j in range(i, c.shape[0] - 1):
        count += 1.0 if count < c[j + 1] else 0.0
        c[j + 1] = count
