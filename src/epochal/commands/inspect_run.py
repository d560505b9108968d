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

__all__ = ["run_sources", "run_step"]


def run_sources(args: argparse.Namespace) -> int:
    """Print the blend ledger of the newest checkpoint of run ``args.prefix``; 0, or 1 after the error."""
    from pathlib import Path

    from epochal.train.state.checkpoint import Checkpointer

    run_dir = Path(args.prefix)
    folder = run_dir / "checkpoints"
    latest = Checkpointer(folder).latest() if folder.is_dir() else None
    if latest is None:
        print(
            f"epochal inspect: error: {run_dir} has no checkpoint to read a ledger from",
            file=sys.stderr,
        )
        return 1
    state = Checkpointer(folder).read_trainer_state(latest)
    ledger = state.get("blend_ledger")
    if not isinstance(ledger, list):
        print(
            f"epochal inspect: error: {latest} records no blend ledger (the run does not blend "
            "several data paths, or was saved by an older epochal)",
            file=sys.stderr,
        )
        return 1
    step, consumed = int(state.get("step", 0)), int(state.get("consumed_train_samples", 0))
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(run_dir),
                    "checkpoint": str(latest),
                    "step": step,
                    "consumed_samples": consumed,
                    "sources": ledger,
                }
            )
        )
        return 0
    print(f"{run_dir} after step {step} ({consumed:,} global samples; checkpoint {latest.name})")
    rows = []
    for entry in ledger:
        docs = (entry.get("next") or {}).get("documents") or []
        where = f"document {docs[0][0]}, token {docs[0][1]}" if docs else "-"
        share = entry["samples"] / consumed if consumed else 0.0
        rows.append(
            {
                "source": str(entry["source"]),
                "samples": f"{entry['samples']:,}",
                "share": f"{share:.3f}",
                "epoch": str(entry["epoch"]),
                "next sample": f"{entry['next_sample']:,}",
                "next starts at": where,
                "name": str(entry["name"]),
            }
        )
    columns = list(rows[0]) if rows else []
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(width[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(width[c]) for c in columns).rstrip())
    return 0


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
