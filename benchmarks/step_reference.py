"""Record, or compare against, what training computes: every record and the final state's bits.

A change to the step machinery (how a step's loss is normalised, how gradients are
synchronised, how a pipeline call keeps its state) must not change one bit of what
training computes. This script trains a fixed set of runs through ``epochal train``
(every preset, the big ones at a tiny width, and the parallel layouts with and without
``training.layout_invariant``, dropout on) and writes, per run, every train and
evaluation record of ``metrics.jsonl`` (losses, gradient norms, learning rates,
evaluation values, logged values, sample digests; wall-clock fields left out) and a
SHA-256 of every tensor and value of the final checkpoint (weights, optimizer state,
scheduler, RNG states), consolidated over the ranks.

    python benchmarks/step_reference.py --record before.json            # all runs
    python benchmarks/step_reference.py --compare before.json           # after a change
    python benchmarks/step_reference.py --record r.json --only tiny,dp2  # some runs

``--compare`` prints a table (run, records, state, first difference) and exits 1 if any
value differs. Each run uses one thread per process (``OMP_NUM_THREADS=1``), so the
bits do not depend on how busy the machine is; they may differ between CPU kinds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

#: record fields that measure time or memory, not what was computed
UNTIMED = ("time", "per_s", "tflops", "mfu", "mem_", "rss")

_DROPOUT = ["--model.hidden_dropout=0.1", "--model.attention_dropout=0.1"]
_SHORT = ["--training.train_iters=10", "--training.eval_interval=5", "--training.eval_iters=1"]
_SAVE = ["--checkpoint.save_interval=10", "--logging.log_interval=1"]
#: a tiny width for the presets whose own shape is too big for a CPU run of 10 steps
_SMALL_MODEL = [
    "--model.num_layers=2",
    "--model.hidden_size=64",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=128",
]
#: the real proteins shipped with the package (esm2-8m needs a protein source)
PROTEINS = Path(__file__).resolve().parents[1] / "src/epochal/data/proteins/examples/proteins.fasta"
_TINY_GPT = ["--preset", "tiny", *_SHORT, *_SAVE, *_DROPOUT]
_MOE = ["--preset", "moe-tiny", *_SHORT, *_SAVE, *_DROPOUT]


def _layouts() -> dict[str, list[str]]:
    """The parallel runs: each layout with and without layout invariance."""
    layouts = {
        "dp2": [*_TINY_GPT, "--parallel.data_parallel=2"],
        "dp2_distopt": [
            *_TINY_GPT,
            "--parallel.data_parallel=2",
            "--parallel.dp_sharding=optimizer",
        ],
        "tp2_sp": [
            *_TINY_GPT,
            "--parallel.tensor_parallel=2",
            "--parallel.sequence_parallel=true",
        ],
        "pp2_1f1b": [*_TINY_GPT, "--parallel.pipeline_parallel=2"],
        "pp2_interleaved": [
            *_TINY_GPT,
            "--parallel.pipeline_parallel=2",
            "--parallel.virtual_pipeline=2",
            "--parallel.pipeline_schedule=interleaved_1f1b",
        ],
        "ep2": [*_MOE, "--parallel.expert_parallel=2"],
        "cp2": [*_TINY_GPT, "--parallel.context_parallel=2"],
        # three micro-batches per rank: a count whose reciprocal is not exact in binary
        "dp2_three": [
            *_TINY_GPT,
            "--parallel.data_parallel=2",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=12",
        ],
        "pp2_three": [
            *_TINY_GPT,
            "--parallel.pipeline_parallel=2",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=6",
        ],
        "moe_pp2": [*_MOE, "--parallel.pipeline_parallel=2"],
        "sft_dp2": [
            "--preset",
            "sft-tiny",
            *_SHORT,
            *_SAVE,
            *_DROPOUT,
            "--parallel.data_parallel=2",
        ],
        "sft_pp2": [
            "--preset",
            "sft-tiny",
            *_SHORT,
            *_SAVE,
            *_DROPOUT,
            "--parallel.pipeline_parallel=2",
        ],
        "bert_pp2": [
            "--preset",
            "bert-tiny",
            *_SHORT,
            *_SAVE,
            *_DROPOUT,
            "--parallel.pipeline_parallel=2",
        ],
    }
    out = {}
    for name, args in layouts.items():
        for invariant in (False, True):
            out[f"{name}_{'exact' if invariant else 'plain'}"] = [
                *args,
                f"--training.layout_invariant={'true' if invariant else 'false'}",
            ]
    return out


def cases() -> dict[str, list[str]]:
    """Run name -> ``epochal train`` options (the run directory is added)."""
    presets = {
        name: ["--preset", name, *_SHORT, *_SAVE, *_DROPOUT]
        for name in ("tiny", "moe-tiny", "sft-tiny", "bert-tiny", "t5-tiny", "esm-tiny")
    }
    presets["esm2-8m"] = [
        "--preset",
        "esm2-8m",
        *_SHORT,
        *_SAVE,
        *_SMALL_MODEL,
        "--data.seq_length=64",
        "--training.micro_batch_size=2",
        "--training.global_batch_size=4",
        f"--data.protein_path={PROTEINS}",
    ]
    for name in ("gpt2-small", "gpu-1b"):
        presets[name] = [
            "--preset",
            name,
            *_SHORT,
            *_SAVE,
            *_SMALL_MODEL,
            *_DROPOUT,
            "--data.data_path=[]",
            "--data.corpus=",
            "--data.mock=true",
            "--data.seq_length=64",
            "--training.micro_batch_size=2",
            "--training.global_batch_size=8",
            "--training.device=cpu",
            "--training.compile=false",
        ]
    presets["gpu-1b"].append("--model.num_query_groups=2")  # its GQA at the tiny width
    presets["tiny_fp16"] = [*_TINY_GPT, "--training.fp16=true"]
    presets["tiny_accumulate"] = [*_TINY_GPT, "--training.micro_batch_size=2"]
    presets["tiny_three"] = [
        *_TINY_GPT,
        "--training.micro_batch_size=2",
        "--training.global_batch_size=6",
    ]
    presets["sft_three"] = [
        "--preset",
        "sft-tiny",
        *_SHORT,
        *_SAVE,
        *_DROPOUT,
        "--training.micro_batch_size=2",
        "--training.global_batch_size=6",
    ]
    return {**presets, **_layouts(), **{name: [] for name in SCRIPTS}}


#: Accelerate scripts run on epochal's front end (``OUT``: the JSON report they write)
_TESTS = Path(__file__).resolve().parents[1] / "tests" / "accelerate"
_LAUNCH = [sys.executable, "-m", "epochal.cli", "launch", "--cpu", "--num_processes"]
SCRIPTS: dict[str, list[str]] = {
    "accelerate_num_items": [*_LAUNCH, "1", str(_TESTS / "num_items_worker.py"), "OUT"],
    "accelerate_num_items_dp2": [*_LAUNCH, "2", str(_TESTS / "num_items_worker.py"), "OUT"],
    "accelerate_guide_clm": [
        sys.executable,
        str(_TESTS / "guide_script.py"),
        "--task=clm",
        "--max_train_steps=6",
        "--report=OUT",
    ],
    "accelerate_guide_mlm": [
        sys.executable,
        str(_TESTS / "guide_script.py"),
        "--task=mlm",
        "--max_train_steps=6",
        "--report=OUT",
    ],
}


def _run(name: str, cmd: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEGATRON_LM_", "ACCELERATE_"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(_TESTS.parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def run_script(name: str, cmd: list[str], root: Path) -> dict[str, Any]:
    """Run one Accelerate script in ``root/name``; its JSON report as the records."""
    folder = root / name
    folder.mkdir()
    out = folder / "report.json"
    t0 = time.perf_counter()
    _run(name, [str(out) if a == "OUT" else a.replace("=OUT", f"={out}") for a in cmd], folder)
    report = json.loads(out.read_text())
    return {"records": [{"kind": "report", **report}], "state": {}, "seconds": _since(t0)}


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)


def run_case(name: str, args: list[str], root: Path) -> dict[str, Any]:
    """Train one case in ``root/name``; its records and final-state digests."""
    if name in SCRIPTS:
        return run_script(name, SCRIPTS[name], root)
    run_dir = root / name
    t0 = time.perf_counter()
    _run(name, [sys.executable, "-m", "epochal.cli", "train", *args, f"--run_dir={run_dir}"], root)
    records = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") in ("train", "eval"):
            records.append({k: v for k, v in record.items() if not any(u in k for u in UNTIMED)})
    return {
        "records": records,
        "state": state_digests(run_dir / "checkpoints"),
        "seconds": _since(t0),
    }


def state_digests(checkpoints: Path) -> dict[str, str]:
    """SHA-256 of every entry of the newest checkpoint, consolidated over the ranks (DCP)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = checkpoints / (checkpoints / "latest").read_text().strip()
    digests: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        whole = Path(tmp) / "state.pt"
        dcp_to_torch_save(folder, whole)
        state = torch.load(whole, weights_only=True)
    _digest_tree("", state, digests)
    for extra in sorted(folder.glob("rng_rank*.pt")):
        _digest_tree(extra.stem, torch.load(extra, weights_only=True), digests)
    return digests


def _digest_tree(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            _digest_tree(f"{prefix}/{key}", value[key], out)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _digest_tree(f"{prefix}[{i}]", item, out)
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        flat = t.reshape(-1)
        raw = flat.to(torch.uint8) if t.dtype == torch.bool else flat.view(torch.uint8)
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(raw.numpy().tobytes())
        out[prefix] = h.hexdigest()[:16]
    else:
        out[prefix] = repr(value)


def _same(x: Any, y: Any) -> bool:
    """Equal values, where two NaNs (an fp16 step the scaler skipped) count as the same."""
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    return x == y


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The first record field or state entry that differs, or ``""``."""
    if len(a["records"]) != len(b["records"]):
        return f"{len(a['records'])} vs {len(b['records'])} records"
    for ra, rb in zip(a["records"], b["records"]):
        for key in sorted(set(ra) | set(rb)):
            if not _same(ra.get(key), rb.get(key)):
                return (
                    f"{ra['kind']} step {ra.get('step')} {key}: {ra.get(key)!r} vs {rb.get(key)!r}"
                )
    for key in sorted(set(a["state"]) | set(b["state"])):
        if a["state"].get(key) != b["state"].get(key):
            return f"state {key}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--record", help="write the runs' records and digests to this JSON file")
    mode.add_argument("--compare", help="train again and compare with this JSON file")
    parser.add_argument("--only", default="", help="comma-separated run names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the runs and exit")
    args = parser.parse_args()
    todo = cases()
    if args.list:
        for name, options in todo.items():
            print(name, " ".join(options))
        return 0
    if not (args.record or args.compare):
        parser.error("give --record FILE or --compare FILE (or --list)")
    if args.only:
        todo = {n: todo[n] for n in args.only.split(",")}
    reference = json.loads(Path(args.compare).read_text()) if args.compare else {}
    results: dict[str, Any] = {}
    failed = 0
    print(f"{'run':<26} {'records':>7} {'state':>6} {'s':>6}  first difference")
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in todo.items():
            results[name] = run_case(name, options, Path(tmp))
            got = results[name]
            if args.compare:
                if name not in reference:
                    diff = "not in the reference"
                else:
                    diff = first_difference(reference[name], got)
                failed += bool(diff)
                same = "equal" if not diff else "DIFF"
                print(f"{name:<26} {len(got['records']):>7} {same:>6} {got['seconds']:>6}  {diff}")
            else:
                print(
                    f"{name:<26} {len(got['records']):>7} {len(got['state']):>6} {got['seconds']:>6}"
                )
            sys.stdout.flush()
    if args.record:
        Path(args.record).write_text(json.dumps(results, indent=1, sort_keys=True))
    if args.compare:
        print(f"{len(todo) - failed} of {len(todo)} runs bit-identical to {args.compare}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
