"""Where a profiled step's GPU time goes: a summary of a Chrome trace written by ``logging.profile_steps``.

Reads ``trace_steps_S-E.json`` (``torch.profiler``'s Chrome trace) and prints:

- the traced window (first to last GPU kernel), the time the GPU was busy (the union of
  kernel intervals) and so the idle share: host synchronisation, launch gaps and
  Python overhead show up as idle GPU time;
- kernel time by kind (matrix products, attention, Triton-generated fused kernels,
  optimizer, copies, other);
- the kernels that took most time;
- the GPU's idle gaps over ``--gap-ms`` and what the host was doing then (the CPU-side
  operators and annotations that span each gap's middle), summed by the innermost one.

    python benchmarks/trace_summary.py runs/x/profile/trace_steps_6-7.json [--top 15]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

#: kernel kind -> name pattern (first match wins)
KINDS = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn.*mha", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.I)),
    ("triton (fused)", re.compile(r"^triton_", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
]


def kind_of(name: str) -> str:
    """The kind of a kernel by its name (see :data:`KINDS`)."""
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


def _host_activity(events: list[dict], gaps: list[tuple[float, float]]) -> list[list[str]]:
    """For each gap, the names of the host events spanning its middle, innermost first."""
    host = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cpu_op", "user_annotation", "python_function", "cuda_runtime")
    ]
    out = []
    for start, end in gaps:
        mid = (start + end) / 2
        spanning = sorted((b - a, name) for a, b, name in host if a <= mid <= b)
        out.append([name for _, name in spanning])
    return out


def summarize(path: Path, top: int = 15, gap_ms: float = 0.2) -> str:
    """The summary of one trace file as text."""
    events = json.loads(path.read_text())
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    kernels = [
        e
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    ]
    if not kernels:
        return f"{path}: no GPU kernels in the trace"
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in kernels)
    window = spans[-1][1] - spans[0][0]
    busy, cur_start, cur_end = 0.0, spans[0][0], spans[0][1]
    gaps: list[tuple[float, float]] = []
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            if start - cur_end > gap_ms * 1e3:
                gaps.append((cur_end, start))
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        dur = float(e.get("dur", 0))
        by_kind[kind_of(e["name"])] += dur
        by_name[e["name"]][0] += dur
        by_name[e["name"]][1] += 1
    total = sum(by_kind.values())
    lines = [
        f"{path.name}: window {window / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms "
        f"({100 * busy / window:.1f}%), idle {(window - busy) / 1e3:.1f} ms; "
        f"{len(kernels)} kernels, {total / 1e3:.1f} ms kernel time",
        "| kind | ms | share of kernel time |",
        "|---|---|---|",
    ]
    for kind, dur in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {dur / 1e3:.1f} | {100 * dur / total:.1f}% |")
    lines += ["", "| kernel | calls | ms |", "|---|---|---|"]
    for name, (dur, calls) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {name[:90]} | {calls} | {dur / 1e3:.1f} |")
    activity = _host_activity(events, gaps)
    by_host: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for (start, end), names in zip(gaps, activity, strict=True):
        key = " < ".join(names[:3]) or "(no host event)"
        by_host[key][0] += end - start
        by_host[key][1] += 1
    lines += [
        "",
        f"GPU idle gaps over {gap_ms} ms: {len(gaps)}, {sum(b - a for a, b in gaps) / 1e3:.1f} ms; "
        "by what the host was doing (innermost first):",
        "| host events spanning the gap | gaps | ms |",
        "|---|---|---|",
    ]
    for key, (dur, n) in sorted(by_host.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"| {key[:120]} | {n} | {dur / 1e3:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--gap-ms", type=float, default=0.2, help="idle gaps listed (ms)")
    args = parser.parse_args()
    for trace in args.traces:
        print(summarize(trace, args.top, args.gap_ms))


if __name__ == "__main__":
    main()
