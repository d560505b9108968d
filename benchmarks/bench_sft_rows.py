"""Memory of reading fine-tuning rows: peak RSS of one process building its SFT datasets.

Writes a JSONL file of chat rows (``--mb`` megabytes, seeded; words of the packaged
chat rows, 1 to 3 user / assistant turns, some with a system message) and builds the
datasets of a fine-tuning run from it (``build_sft_datasets``, packed, ``"98,2"``
split, ``--seq-length`` tokens, ``overlength="truncate"``) with the packaged chat
tokenizer, each case in a fresh process:

- ``rows in memory``: the rows read and tokenized as Python objects
  (``read_sft_rows`` + ``tokenize_sft_rows``, packed from the list);
- ``no cache``: ``build_sft_datasets(cache_dir=None)`` (a token store built in a
  temporary folder and read into memory);
- ``cold cache``: ``cache_dir`` empty: the file is tokenized into the cache (what rank 0
  of the first run pays);
- ``warm cache``: the same ``cache_dir`` again: the store is mapped (what every other
  rank, and every later run, pays).

Each process reports the growth of its peak RSS (``ru_maxrss``) over what it held once
the tokenizer was loaded: after building the datasets, and after reading every train
sample once (which maps the store's pages: shared by all processes of a machine and
evictable, as Megatron's indexed files are). Run with an older epochal on
``PYTHONPATH`` to measure it (only the cases its ``build_sft_datasets`` supports run).

    python benchmarks/bench_sft_rows.py                # 56 MB of rows, a few minutes
    python benchmarks/bench_sft_rows.py --mb 5 --cases warm
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

CASES = ("rows in memory", "no cache", "cold cache", "warm cache")

CHILD = r"""
import json, resource, sys, time
from epochal.data.sft import build_sft_datasets, load_chat_tokenizer
from epochal.data.sft.examples import TOKENIZER_DIR

case, path, cache, seq = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tokenizer = load_chat_tokenizer(TOKENIZER_DIR)
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
base = peak()
start = time.perf_counter()
options = dict(seq_length=seq, split="98,2", packing=True, overlength="truncate")
if case == "rows in memory":
    from epochal.data.datasets.splits import split_document_ranges
    from epochal.data.sft import PackedSFTDataset, read_sft_rows, tokenize_sft_rows

    rows = read_sft_rows(path)
    (a, b), *_ = split_document_ranges("98,2", len(rows))
    examples = tokenize_sft_rows(rows[a:b], tokenizer, max_length=seq, overlength="truncate")
    train = PackedSFTDataset(examples.examples, seq, pad_token_id=tokenizer.pad_token_id)
else:
    if case != "old build":
        options["cache_dir"] = None if case == "no cache" else cache
    train = build_sft_datasets(path, tokenizer, **options).train
seconds = time.perf_counter() - start
built = peak() - base
for i in range(len(train)):
    train[i]
print(json.dumps({"built": built, "read": peak() - base, "seconds": seconds,
                  "samples": len(train)}))
"""


def write_rows(path: Path, megabytes: float, seed: int) -> int:
    """Chat rows of the packaged file's words until ``megabytes``; returns the row count."""
    from epochal.data.sft.examples import CHAT_FILE

    words = sorted(set(CHAT_FILE.read_text(encoding="utf-8").replace('"', " ").split()))
    words = [w for w in words if w.isalpha()]
    rng = random.Random(seed)

    def text(low: int, high: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(low, high)))

    target, written, rows = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            messages = [{"role": "system", "content": text(3, 10)}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 3)):
                messages.append({"role": "user", "content": text(5, 40)})
                messages.append({"role": "assistant", "content": text(5, 60)})
            line = json.dumps({"messages": messages}) + "\n"
            out.write(line)
            written += len(line.encode())
            rows += 1
    return rows


def supports_cache() -> bool:
    import inspect

    from epochal.data.sft import build_sft_datasets

    return "cache_dir" in inspect.signature(build_sft_datasets).parameters


def run_case(case: str, path: Path, cache: Path, seq: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(path), str(cache), str(seq)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{case}: failed\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=56.0, help="size of the JSONL file, MB")
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default=",".join(c.split()[0] for c in CASES))
    args = parser.parse_args()
    wanted = [c for c in CASES if c.split()[0] in args.cases.split(",")]
    if not supports_cache():
        wanted = ["old build"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.jsonl"
        rows = write_rows(path, args.mb, args.seed)
        size = os.path.getsize(path) / 1e6
        print(f"{rows:,} chat rows, {size:.1f} MB of JSONL, seq_length {args.seq_length}")
        print(
            f"{'case':<16} {'peak RSS built':>15} {'+ every sample':>15} {'seconds':>8} {'samples':>8}"
        )
        cache = Path(tmp) / "cache"
        if "warm cache" in wanted and "cold cache" not in wanted:
            run_case("cold cache", path, cache, args.seq_length)  # fill the cache first
        for case in wanted:
            out = run_case(case, path, cache, args.seq_length)
            print(
                f"{case:<16} {out['built']:>11.0f} MiB {out['read']:>11.0f} MiB "
                f"{out['seconds']:>8.1f} {out['samples']:>8,}"
            )


if __name__ == "__main__":
    main()
