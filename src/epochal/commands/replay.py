"""``epochal replay RUN --step N``: re-train step N of a run in another layout and compare bit for bit.

The step is trained again from the newest checkpoint before it, with the run's
configuration, on one process unless layout options are given
(``--parallel.tensor_parallel=2``, ...; several processes are launched as
``epochal train`` launches them). The loss and gradient norm of every replayed
step, the evaluation values and the weights after step N (the digest the run's
checkpoint of step N recorded) are compared with the run's records; the last line
says ``identical`` or names what differs. Examples::

    epochal replay runs/tp2 --step 20
    epochal replay runs/tp2 --step 20 --parallel.tensor_parallel=2

Exit status: 0 identical, 1 something differs, 2 the run cannot be replayed at
that step (the message says why).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``RUN``, ``--step``, ``--keep``, ``--json`` and the layout overrides."""
    parser.add_argument("run_dir", metavar="RUN", help="the run directory (epochal train's)")
    parser.add_argument(
        "--step", type=int, required=True, help="the optimizer step to replay (1-based)"
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        default=None,
        help="train the replay in DIR and keep it (default: a temporary directory)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parse_known = parser.parse_known_args

    def parse_args(args=None, namespace=None):  # noqa: ANN001, ANN202 - argparse's signature
        ns, unknown = parse_known(args, namespace)
        bad = [u for u in unknown if not (u.startswith("--") and "=" in u)]
        if bad:
            parser.error(
                f"unrecognized arguments: {' '.join(bad)} (layout options look like "
                "--parallel.tensor_parallel=2)"
            )
        ns.overrides = unknown
        return ns

    parser.parse_args = parse_args  # type: ignore[method-assign]


_SHOWN = ("train loss", "grad_norm", "eval loss")


def _show(value: object) -> str:
    return repr(value) if value is not None else "(none)"


def run(args: argparse.Namespace) -> int:
    """Replay and print the comparison; 0 identical, 1 differs, 2 error."""
    from epochal.train.replay import ReplayError, replay_step

    try:
        result = replay_step(
            args.run_dir, args.step, list(getattr(args, "overrides", [])), work_dir=args.keep
        )
    except ReplayError as exc:
        print(f"epochal replay: error: {exc}", file=sys.stderr)
        return 2
    layout = " ".join(getattr(args, "overrides", [])) or "one process"
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(result.run_dir),
                    "step": result.step,
                    "from_checkpoint_step": result.start,
                    "layout": layout,
                    "identical": result.identical,
                    "weights_note": result.weights_note,
                    "comparisons": [
                        {"what": c.what, "run": c.run, "replay": c.replay, "equal": c.equal}
                        for c in result.comparisons
                    ],
                }
            )
        )
        return 0 if result.identical else 1
    begin = f"checkpoint of step {result.start}" if result.start else "the start"
    print(
        f"{result.run_dir}: replayed steps {result.start + 1}-{result.step} from {begin} ({layout})"
    )
    #: shown always; the other values (learning rate, sample digest, ...) only where they differ
    shown = [
        c
        for c in result.comparisons
        if not c.equal or c.what.endswith(_SHOWN) or c.what.startswith("weights")
    ]
    width = max((len(c.what) for c in shown), default=0)
    for c in shown:
        mark = "equal" if c.equal else "DIFFERS"
        print(f"  {c.what.ljust(width)}  run {_show(c.run)}  replay {_show(c.replay)}  {mark}")
    print(f"  {len(result.comparisons)} values compared bit for bit")
    if result.weights_note:
        print(f"  weights after step {result.step}: not compared ({result.weights_note})")
    differing = [c.what for c in result.comparisons if not c.equal]
    if differing:
        print(f"differs: {', '.join(differing)}")
        return 1
    print("identical")
    return 0
