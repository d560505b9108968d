"""Blend weights that change over training, and an exact lazy rule for which source serves a sample.

A :class:`BlendSchedule` is a list of points ``(first global sample, weights)`` with
``"step"`` or ``"linear"`` interpolation; two points at the same sample make a jump
there (a step change inside a linear schedule: the second point's shares hold from it). Each point's weights are normalized to shares
that sum to 1 (exact rationals: a weight is read as the decimal it prints as, so
``0.3`` is ``3/10``); global sample ``i`` has the share vector

- before the first point: the first point's shares;
- ``"step"``: the shares of the last point at or before ``i``;
- ``"linear"``: between two points, the shares interpolated linearly at ``i``;
- from the last point on: the last point's shares.

The **target** of source ``s`` after ``n`` samples is ``T_s(n) = sum_{i < n} share_s(i)``
(closed form per segment: an arithmetic series), so ``sum_s T_s(n) = n``.

:class:`BlendSelector` turns targets into exact counts without any index: sources sit
at the leaves of a balanced binary tree. A node ``v`` that has served ``m`` samples
gives its left child ``floor(g_v(m) + 1/2)`` of them, where ``g_v(m)`` is the left
child's target at the moment node ``v``'s target reaches ``m`` (``T_v`` inverted: a
quadratic per segment, solved in floating point and then settled exactly in rationals).
``g_v`` is continuous, nondecreasing, with slope at most 1, so each child's count
grows by 0 or 1 per sample and the two always sum to the node's count: every sample
goes to exactly one source, each source's samples are numbered ``0, 1, 2, ...``
without gaps or repeats, and source ``s``'s count after ``n`` samples is within
``depth / 2`` of ``T_s(n)`` (depth = ``ceil(log2(#sources))``: below 1 for up to 4
sources), at every ``n``: the error does not accumulate. Locating sample ``n`` costs
``O(depth * log #points)``; nothing is stored per sample. Each node's decision is made
in floating point (one bisection over the segments, then O(1) operations) with an
error bound; only a decision within that bound of its rounding boundary (an exact
tie, frequent with small integer weights, whose denominators are then small too) is
settled in exact integers over the schedule's common denominator, whose size grows
with the number of points. Both give the same selection, sample for sample.

A selector can start at any ``origin``: then it apportions ``T_s(origin + x) -
T_s(origin)`` (how a resumed run continues with a changed future, see
:mod:`epochal.data.datasets.scheduled_blend`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

__all__ = ["BlendSchedule", "BlendSelector", "exact_weight"]

INTERPOLATIONS = ("step", "linear")


def exact_weight(value: Any, what: str = "weight") -> Fraction:
    """A weight as an exact rational (a float is read as the decimal it prints as).

    Raises:
        ValueError: not a finite number >= 0 (the message names ``what``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str | Fraction):
        try:
            value = float(value)  # numpy scalars
        except (TypeError, ValueError):
            raise ValueError(f"{what} must be a number, got {value!r}") from None
    try:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError
            value = repr(value)
        frac = Fraction(value)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{what} must be a finite number, got {value!r}") from None
    if frac < 0:
        raise ValueError(f"{what} must be >= 0, got {value!r}")
    return frac


class BlendSchedule:
    """Piecewise step or linear blend shares over global sample numbers (see the module docstring).

    Args:
        points: ``(first_sample, weights)`` pairs, first samples increasing (two equal: a jump) and
            ``>= 0``, every weight list as long as the first, weights ``>= 0`` with at
            least one positive per point.
        interpolation: ``"step"`` or ``"linear"``.
        steps: optional step number of each point (only for messages and records).

    Raises:
        ValueError: naming the point and what is wrong with it.
    """

    def __init__(
        self,
        points: Sequence[tuple[int, Sequence[Any]]],
        interpolation: str = "step",
        steps: Sequence[int] | None = None,
    ) -> None:
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be 'step' or 'linear', got {interpolation!r}")
        points = list(points)
        if not points:
            raise ValueError("a blend schedule needs at least one point")
        self.interpolation = interpolation
        self.samples: list[int] = []
        self.shares: list[list[Fraction]] = []
        width = len(points[0][1])
        for p, (sample, weights) in enumerate(points):
            weights = list(weights)
            if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
                raise ValueError(f"point {p}: its first sample must be an int >= 0, got {sample!r}")
            if self.samples and sample < self.samples[-1]:
                raise ValueError(f"point {p}: points must be in increasing order of steps")
            if len(self.samples) >= 2 and sample == self.samples[-1] == self.samples[-2]:
                raise ValueError(f"point {p}: at most two points may share a step (a jump)")
            if len(weights) != width or width == 0:
                raise ValueError(
                    f"point {p}: has {len(weights)} weights, point 0 has {width}; "
                    "give one weight per source"
                )
            exact = [exact_weight(w, f"point {p} weight {i}") for i, w in enumerate(weights)]
            total = sum(exact)
            if total <= 0:
                raise ValueError(f"point {p}: at least one weight must be > 0")
            self.samples.append(int(sample))
            self.shares.append([w / total for w in exact])
        self.steps = list(steps) if steps is not None else None
        self.sources = width
        self._segments = self._build_segments()

    # --------------------------------------------------------------- segments
    def _build_segments(self) -> list[tuple[int, list[Fraction], list[Fraction]]]:
        """``(start, a, b)`` per segment: ``share(i) = a + b * (i - start)`` up to the next start."""
        segs: list[tuple[int, list[Fraction], list[Fraction]]] = []
        zero = [Fraction(0)] * self.sources
        if self.samples[0] > 0:
            segs.append((0, self.shares[0], zero))
        for j, start in enumerate(self.samples):
            if j + 1 < len(self.samples) and self.samples[j + 1] == start:
                continue  # the first of two points at one step: the jump starts at the second
            a = self.shares[j]
            b = zero
            if self.interpolation == "linear" and j + 1 < len(self.samples):
                span = self.samples[j + 1] - start
                b = [(q - p) / span for p, q in zip(a, self.shares[j + 1])]
            segs.append((start, a, b))
        return segs

    @property
    def segments(self) -> list[tuple[int, list[Fraction], list[Fraction]]]:
        return self._segments

    def is_constant(self) -> bool:
        """Whether every sample has the same shares."""
        return all(s == self.shares[0] for s in self.shares)

    def share(self, i: int) -> list[Fraction]:
        """The shares of global sample ``i`` (exact)."""
        k = bisect.bisect_right([s for s, _, _ in self._segments], i) - 1
        start, a, b = self._segments[max(k, 0)]
        return [x + y * (i - start) for x, y in zip(a, b)]

    def targets(self, n: int) -> list[Fraction]:
        """``T_s(n)``: the sum of source ``s``'s shares over samples ``0 .. n - 1`` (exact)."""
        out = [Fraction(0)] * self.sources
        for k, (start, a, b) in enumerate(self._segments):
            if n <= start:
                break
            end = self._segments[k + 1][0] if k + 1 < len(self._segments) else n
            j = min(n, end) - start
            out = [t + x * j + y * (j * (j - 1) // 2) for t, x, y in zip(out, a, b)]
        return out

    def first_difference(self, other: BlendSchedule, before: int) -> int | None:
        """The first global sample below ``before`` whose shares differ from ``other``'s, or None.

        Both are linear between the union of their segment starts, so comparing at each
        piece's first and last sample decides every sample.
        """
        cuts = sorted({s for s, _, _ in self._segments} | {s for s, _, _ in other._segments})
        cuts = [c for c in cuts if c < before] + [before]
        for lo, hi in zip(cuts, cuts[1:]):
            if self.share(lo) != other.share(lo):
                return lo
            if hi - 1 > lo and self.share(hi - 1) != other.share(hi - 1):
                return lo + 1
        return None

    def to_json(self) -> dict[str, Any]:
        """A JSON form that :meth:`from_json` reads back exactly (shares as ``"p/q"`` strings)."""
        return {
            "interpolation": self.interpolation,
            "samples": self.samples,
            "steps": self.steps,
            "shares": [[str(w) for w in s] for s in self.shares],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BlendSchedule:
        """Read :meth:`to_json`'s form.

        Raises:
            ValueError / KeyError / TypeError: malformed.
        """
        points = [
            (int(s), [Fraction(w) for w in ws]) for s, ws in zip(data["samples"], data["shares"])
        ]
        return cls(points, data["interpolation"], data.get("steps"))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BlendSchedule)
            and self.interpolation == other.interpolation
            and self.samples == other.samples
            and self.shares == other.shares
        )

    def __repr__(self) -> str:
        return (
            f"BlendSchedule({self.interpolation}, {len(self.samples)} points, "
            f"{self.sources} sources)"
        )


def _common_denominator(schedule: BlendSchedule) -> int:
    """The least common multiple of the denominators of every segment's ``a`` and ``b``."""
    q = 1
    for _, a, b in schedule.segments:
        for x in (*a, *b):
            q = math.lcm(q, x.denominator)
    return q


class _Node:
    """Prefix sums of one tree node's shares (a contiguous range of sources) per segment.

    Every quantity is an integer numerator over the schedule's common denominator
    ``q`` (exact, and much faster than :class:`~fractions.Fraction`, which reduces
    every result).
    """

    def __init__(self, schedule: BlendSchedule, lo: int, hi: int, origin: int, q: int) -> None:
        self.lo, self.hi, self.q = lo, hi, q
        self.starts = [s for s, _, _ in schedule.segments]
        self.a = [int(sum(a[lo:hi]) * q) for _, a, _ in schedule.segments]
        self.b = [int(sum(b[lo:hi]) * q) for _, _, b in schedule.segments]
        self.base: list[int] = []  # T_v at each segment start (numerators)
        total = 0
        for k, start in enumerate(self.starts):
            self.base.append(total)
            if k + 1 < len(self.starts):
                total += self._series(k, self.starts[k + 1] - start)
        self.at_origin = self.at(origin)
        # the same in floats, relative to the origin (the fast path of BlendSelector)
        self.base_f = [float(Fraction(c - self.at_origin, q)) for c in self.base]
        self.a_f = [float(Fraction(x, q)) for x in self.a]
        self.b_f = [float(Fraction(x, q)) for x in self.b]

    def _series(self, k: int, j: int) -> int:
        return self.a[k] * j + self.b[k] * (j * (j - 1) // 2)

    def segment_of(self, i: int) -> int:
        return bisect.bisect_right(self.starts, i) - 1

    def at(self, i: int) -> int:
        """``T_v(i)`` for an integer sample ``i`` (numerator)."""
        k = self.segment_of(i)
        return self.base[k] + self._series(k, i - self.starts[k])

    def rate(self, i: int) -> int:
        """The node's share of sample ``i`` (numerator)."""
        k = self.segment_of(i)
        return self.a[k] + self.b[k] * (i - self.starts[k])

    def reach(self, target: int) -> int | None:
        """The smallest sample ``i`` with ``T_v(i + 1) >= target`` (a numerator above
        ``T_v(0)``), or None when ``T_v`` never gets there."""
        k = bisect.bisect_left(self.base, target) - 1
        last = k + 1 == len(self.starts)
        c, a, b = self.base[k], self.a[k], self.b[k]
        if last and a == 0 and b == 0:
            return None
        limit = None if last else self.starts[k + 1] - self.starts[k]

        def f(j: int) -> int:
            return c + a * j + b * (j * (j - 1) // 2)

        # first guess: the root of b/2 J^2 + (a - b/2) J + (c - target) = 0, in floats
        q = self.q
        qa, qb, qc = b / (2 * q), (2 * a - b) / (2 * q), (c - target) / q
        disc = max(qb * qb - 4 * qa * qc, 0.0)
        denom = qb + math.sqrt(disc)
        guess = math.ceil(-2 * qc / denom) if denom > 0 else 1
        top = limit if limit is not None else max(guess, 1) + 1
        while limit is None and f(top) < target:
            top *= 2
        guess = min(max(guess, 1), top)
        # settle exactly: the smallest J in [1, top] with f(J) >= target, galloping from the guess
        if f(guess) >= target:
            hi_j, step = guess, 1
            while hi_j - step >= 1 and f(hi_j - step) >= target:
                hi_j -= step
                step *= 2
            lo_j = max(1, hi_j - step + 1)
        else:
            lo_j, step = guess + 1, 1
            while lo_j + step - 1 < top and f(lo_j + step - 1) < target:
                lo_j += step
                step *= 2
            hi_j = min(top, lo_j + step - 1)
        while lo_j < hi_j:
            mid = (lo_j + hi_j) // 2
            if f(mid) >= target:
                hi_j = mid
            else:
                lo_j = mid + 1
        return self.starts[k] + lo_j - 1


class BlendSelector:
    """Which source serves each sample of a :class:`BlendSchedule`, exactly and lazily.

    Args:
        schedule: the shares.
        origin: the first global sample this selector apportions (counts start at 0 there).

    See the module docstring for the rule and its guarantees.
    """

    def __init__(self, schedule: BlendSchedule, origin: int = 0) -> None:
        self.schedule = schedule
        self.origin = int(origin)
        self.k = schedule.sources
        # tree: node id -> (lo, hi, left id, right id); built breadth-first from the root
        self._q = _common_denominator(schedule)
        self._nodes: list[_Node] = []
        self._children: list[tuple[int, int] | None] = []
        self._add(0, self.k)
        self._left = lru_cache(maxsize=8192)(self._left_count)
        self.exact_lookups = 0  # node lookups the float path left to exact arithmetic
        self.fast = True  # False: always exact (the reference the fast path must equal)

    def _add(self, lo: int, hi: int) -> int:
        node_id = len(self._nodes)
        self._nodes.append(_Node(self.schedule, lo, hi, self.origin, self._q))
        self._children.append(None)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            left = self._add(lo, mid)
            right = self._add(mid, hi)
            self._children[node_id] = (left, right)
        return node_id

    def _left_count(self, node_id: int, m: int) -> int:
        """Of node ``node_id``'s first ``m`` samples, how many its left child serves."""
        if m <= 0:
            return 0
        if self.fast:
            got = self._left_float(node_id, m)
            if got is not None:
                return got
        self.exact_lookups += 1
        return self._left_exact(node_id, m)

    def _left_float(self, node_id: int, m: int) -> int | None:
        """:meth:`_left_exact` in floats, or None where rounding might decide it otherwise.

        Every float quantity is within ``2**-53`` relative error of its exact value per
        operation (about 20 operations), so an error bound of ``2**-47`` times the sum of
        the magnitudes involved is safe; a comparison or rounding closer than that to its
        boundary (a tie, or a node whose share is nearly 0) goes to exact arithmetic.
        The cost is one bisection over the segments and O(1) float operations: it does
        not depend on the denominators of the schedule.
        """
        node = self._nodes[node_id]
        left = self._nodes[self._children[node_id][0]]  # type: ignore[index]
        base = node.base_f
        k = bisect.bisect_left(base, m) - 1
        last = k + 1 == len(base)
        c, a, b = base[k] - m, node.a_f[k], node.b_f[k]
        if last and a <= 0 and b <= 0:
            return None  # beyond everything the node is owed
        # the smallest J >= 1 with c + a J + b J (J - 1) / 2 >= 0 (first guess, floats)
        qa, qb = b / 2, a - b / 2
        denom = qb + math.sqrt(max(qb * qb - 4 * qa * c, 0.0))
        if denom <= 0:
            return None
        j = max(1, math.ceil(-2 * c / denom))
        if not last:
            j = min(j, node.starts[k + 1] - node.starts[k])
        jj = j - 1  # the node's target reaches m during sample i = start + jj
        i = node.starts[k] + jj
        if i < self.origin:
            return None
        j2 = jj * (jj - 1) // 2
        mag = abs(base[k]) + m + 1.0 + abs(left.base_f[k])
        mag += (abs(a) + abs(left.a_f[k])) * j + (abs(b) + abs(left.b_f[k])) * (j2 + j)
        tol = mag * 2.0**-47
        rate = a + b * jj
        owed = m - (base[k] + a * jj + b * j2)  # exactly in [0, rate] for the exact i
        # g is continuous in m with slope <= 1, so a neighbouring sample's piece extended
        # by tol is as good; farther off (a poor first guess) or a tiny rate: exact
        # (the rate's own error is relative to its terms, not to the sample number)
        rate_tol = (abs(a) + abs(b) * jj + abs(left.a_f[k]) + abs(left.b_f[k]) * jj) * 2.0**-47
        if rate <= rate_tol * 1024 or owed < -2 * tol or owed > rate + 2 * tol:
            return None
        rate_left = left.a_f[k] + left.b_f[k] * jj
        got = left.base_f[k] + left.a_f[k] * jj + left.b_f[k] * j2
        g = got + rate_left * (owed / rate) + 0.5
        err = tol * (6.0 + 3.0 * abs(rate_left) / rate)
        r = math.floor(g)
        if g - r <= err or r + 1 - g <= err:
            return None  # a tie or near one: exact
        return min(m, max(0, r))

    def _left_exact(self, node_id: int, m: int) -> int:
        """Of node ``node_id``'s first ``m`` samples, how many its left child serves.

        ``floor(g + 1/2)`` with ``g`` the left child's target when the node's reaches ``m``,
        in integers: ``g = num / den``.
        """
        if m <= 0:
            return 0
        node = self._nodes[node_id]
        left = self._nodes[self._children[node_id][0]]  # type: ignore[index]
        q = self._q
        target = node.at_origin + m * q
        i = node.reach(target)
        if i is None:  # beyond everything the node will ever be owed: keep its final ratio
            i_last = node.starts[-1]
            owed = node.at(i_last) - node.at_origin
            got = left.at(i_last) - left.at_origin
            num, den = (got * m, owed) if owed > 0 else (m, 2)
        else:
            i = max(i, self.origin)
            rate = node.rate(i)
            got = left.at(i) - left.at_origin
            if rate > 0:
                num = got * rate + left.rate(i) * (target - node.at(i))
                den = q * rate
            else:
                num, den = got, q
        return min(m, max(0, (2 * num + den) // (2 * den)))

    def locate(self, n: int) -> tuple[int, int]:
        """``(source, its sample number counted from this selector's origin)`` of global sample ``n``."""
        t = int(n) - self.origin
        if t < 0:
            raise IndexError(f"sample {n} is before this selector's first sample {self.origin}")
        node_id, m0, m1 = 0, t, t + 1
        while self._children[node_id] is not None:
            left, right = self._children[node_id]  # type: ignore[misc]
            l0, l1 = self._left(node_id, m0), self._left(node_id, m1)
            if l1 > l0:
                node_id, m0, m1 = left, l0, l1
            else:
                node_id, m0, m1 = right, m0 - l0, m1 - l1
        return self._nodes[node_id].lo, m0

    def counts(self, n: int) -> list[int]:
        """Samples each source served among global samples ``origin .. n - 1``."""
        out = [0] * self.k
        stack = [(0, max(0, int(n) - self.origin))]
        while stack:
            node_id, m = stack.pop()
            children = self._children[node_id]
            if children is None:
                out[self._nodes[node_id].lo] = m
                continue
            left = self._left(node_id, m)
            stack.append((children[0], left))
            stack.append((children[1], m - left))
        return out
