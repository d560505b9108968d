"""``epochal inspect RUN --step N``: the samples of step N of a run and their digest.

The library part is :mod:`epochal.train.inputs.run_samples`; this module prints it:
a header, the digest compared with the one the run recorded in ``metrics.jsonl``, and
one row per global sample with the identity the train data gives it (GPT: corpus,
epoch, window and the ``doc[start:end]`` token ranges read; BERT/T5: document and
first-last sentence; ESM-2: epoch, cluster and member; fine-tuning: epoch and table
row). ``--json`` prints one object instead: ``samples`` holds each sample's ``identity``
(what the digest covers) and ``details`` (listed only, e.g. ESM-2's member).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["run_step"]


def run_step(args: argparse.Namespace) -> int:
    """List the samples of ``args.step`` of the run ``args.prefix``; 0, or 1 after the error."""
    if args.step is None:
        print(
            f"epochal inspect: error: {args.prefix} is a run directory; give --step N "
            "(the optimizer step whose samples to list, 1-based)",
            file=sys.stderr,
        )
        return 1
    from epochal.train.inputs.run_samples import run_step_samples

    try:
        found = run_step_samples(
            args.prefix, args.step, log=lambda m: print(m, file=sys.stderr, flush=True)
        )
    except (OSError, ValueError, IndexError) as exc:  # ConfigError is a ValueError
        print(f"epochal inspect: error: {exc}", file=sys.stderr)
        return 1
    s = found.samples
    pairs = list(zip(s.identities, found.details, strict=True))
    if args.json:
        out = {
            "run_dir": str(found.run_dir),
            "step": s.step,
            "first_sample": s.first,
            "digest": s.digest,
            "recorded_digest": found.recorded,
            "samples": [
                {"sample": s.first + k, "identity": ident, "details": more}
                for k, (ident, more) in enumerate(pairs)
            ],
        }
        print(json.dumps(out))
        return 0
    rows = [{"sample": s.first + k, **ident, **more} for k, (ident, more) in enumerate(pairs)]
    n = len(rows)
    print(
        f"{found.run_dir} step {s.step}: global samples {s.first}-{s.first + n - 1} ({n} samples)"
    )
    print(f"data: {found.description}")
    if found.recorded is None:
        print(f"sample digest {s.digest} (metrics.jsonl has no record of step {s.step})")
    elif found.recorded == s.digest:
        print(f"sample digest {s.digest}, as recorded in metrics.jsonl")
    else:
        print(
            f"sample digest {s.digest}; warning: metrics.jsonl recorded {found.recorded}: the "
            "data behind the run's options changed since it trained this step"
        )
    _print_table(rows)
    return 0


def _print_table(rows: list[dict]) -> None:
    """Rows of identities as aligned columns (numbers right-aligned, the last column free)."""
    from epochal.train.inputs.run_samples import format_identity

    cells = [format_identity(r) for r in rows]
    columns: list[str] = []
    for row in cells:
        columns.extend(k for k in row if k not in columns)
    width = {c: max(len(c), *(len(r.get(c, "")) for r in cells)) for c in columns}
    numeric = {c: all(r.get(c, "0").lstrip("-").isdigit() for r in cells) for c in columns}

    def line(values: dict[str, str]) -> str:
        parts = []
        for c in columns:
            v = values.get(c, "")
            last = c == columns[-1]
            parts.append(v.rjust(width[c]) if numeric[c] else (v if last else v.ljust(width[c])))
        return "  ".join(parts).rstrip()

    print(line({c: c for c in columns}))
    for row in cells:
        print(line(row))
