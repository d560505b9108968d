"""Per-sample cost of a blend schedule's lazy selector against its number of points.

A schedule of ``--sources`` sources with points at random (irregular) global samples
in ``0 .. --span`` and random weights, ``"step"`` and ``"linear"``; ``--samples`` random
global samples are located once each (a fresh selector: its cache does not help), with
the float path (``BlendSelector``'s default) and with exact arithmetic only (the
reference the float path equals). ``exact lookups`` counts the node lookups the float
path left to exact arithmetic (near a rounding tie). ``--weights small`` draws weights
from ``0 .. 3``, which makes exact ties frequent. Run::

    python benchmarks/bench_blend_schedule.py            # ~1 minute
"""

from __future__ import annotations

import argparse
import random
import time

from epochal.data.datasets.blend_schedule import BlendSchedule, BlendSelector


def schedule(points: int, sources: int, span: int, interpolation: str, small: bool, seed: int):
    rng = random.Random(seed)
    starts = [0, *sorted(rng.sample(range(1, span), points - 1))]
    pts = []
    for start in starts:
        if small:
            weights = [rng.randrange(4) for _ in range(sources)]
            weights[rng.randrange(sources)] += 1
        else:
            weights = [round(rng.random(), 4) + 0.0001 for _ in range(sources)]
        pts.append((start, weights))
    return BlendSchedule(pts, interpolation)


def per_sample(sched: BlendSchedule, ns: list[int], fast: bool) -> tuple[float, int]:
    sel = BlendSelector(sched)
    sel.fast = fast
    start = time.perf_counter()
    for n in ns:
        sel.locate(n)
    return (time.perf_counter() - start) / len(ns), sel.exact_lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--span", type=int, default=10_000_000)
    parser.add_argument("--points", type=int, nargs="+", default=[2, 8, 32, 128, 512, 1024])
    parser.add_argument("--weights", choices=["random", "small"], default="random")
    parser.add_argument("--no-exact", action="store_true", help="skip the exact-only column")
    args = parser.parse_args()
    rng = random.Random(1)
    ns = [rng.randrange(args.span + args.span // 10) for _ in range(args.samples)]
    print(
        f"{args.sources} sources, {args.samples} random samples, points in 0..{args.span}, "
        f"{args.weights} weights"
    )
    print("| interpolation | points | float path | exact lookups | exact only |")
    print("|---|---:|---:|---:|---:|")
    for interpolation in ("step", "linear"):
        for points in args.points:
            sched = schedule(
                points, args.sources, args.span, interpolation, args.weights == "small", points
            )
            fast, exact_lookups = per_sample(sched, ns, True)
            exact = "-" if args.no_exact else f"{per_sample(sched, ns, False)[0] * 1e6:.1f} us"
            print(
                f"| {interpolation} | {points} | {fast * 1e6:.1f} us | {exact_lookups} | {exact} |"
            )


if __name__ == "__main__":
    main()
