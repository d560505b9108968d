"""Preprocessing Hugging Face inputs: time and peak memory against the JSONL path.

Builds the standard-library corpus of :mod:`bench_preprocess` at each ``--megabytes``
size as JSONL, then writes the same rows as a ``datasets`` ``save_to_disk`` folder and
as one parquet file, and runs ``preprocess`` (GPT-2 BPE, ``--append-eod``, 1 worker) on
each in a fresh interpreter, reporting seconds and the process's peak RSS during the
run above its RSS before it (``VmHWM`` reset through ``/proc/self/clear_refs``; Linux). Streaming shows as a peak that does not grow with the
corpus. Outputs are checked byte-identical to the JSONL run's. Megatron-LM's
``tools/preprocess_data.py`` reads JSON only, so the JSONL path is the reference. Run::

    python benchmarks/bench_preprocess_hf.py --megabytes 8 32   # ~1-2 minutes
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_preprocess import same_files, write_corpus  # noqa: E402

FORMATS = ("jsonl", "save_to_disk", "parquet")


def measure_one(source: str, prefix: str) -> None:
    """Preprocess ``source`` in this (fresh) process; print ``seconds extra_peak_MiB tokens``."""
    import pyarrow.compute  # noqa: F401  # imports are not preprocessing
    import pyarrow.ipc  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from epochal.data import build_tokenizer
    from epochal.data.indexed.preprocess import preprocess

    tokenizer = build_tokenizer("gpt2")
    tokenizer.encode_batch(["warm up"])
    with open("/proc/self/clear_refs", "w") as stream:
        stream.write("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    start = time.perf_counter()
    summary = preprocess(source, prefix, tokenizer, append_eod=True, workers=1)
    seconds = time.perf_counter() - start
    print(f"{seconds} {(_status_kib('VmHWM') - before) / 1024} {summary.total_tokens}")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as stream:
        return next(int(line.split()[1]) for line in stream if line.startswith(field + ":"))


def make_inputs(folder: str, megabytes: float) -> dict[str, str]:
    """The corpus as JSONL, a save_to_disk folder (datasets' default shards) and parquet."""
    import datasets

    paths = {"jsonl": os.path.join(folder, "corpus.jsonl")}
    write_corpus(paths["jsonl"], megabytes, 4096)
    dataset = datasets.load_dataset(
        "json", data_files=paths["jsonl"], split="train", cache_dir=os.path.join(folder, "cache")
    )
    paths["save_to_disk"] = os.path.join(folder, "saved")
    dataset.save_to_disk(paths["save_to_disk"])
    paths["parquet"] = os.path.join(folder, "corpus.parquet")
    dataset.to_parquet(paths["parquet"])
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megabytes", type=float, nargs="+", default=[8, 32])
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: one run
    args = parser.parse_args()
    if args.one:
        measure_one(*args.one)
        return
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    print("| corpus MB | input | seconds | peak RSS above start (MiB) | tokens | same bytes |")
    print("|---:|---|---:|---:|---:|---|")
    for megabytes in args.megabytes:
        with tempfile.TemporaryDirectory() as folder:
            paths = make_inputs(folder, megabytes)
            prefixes = {}
            for name in FORMATS:
                prefixes[name] = os.path.join(folder, f"out_{name}")
                out = subprocess.run(
                    [sys.executable, __file__, "--one", paths[name], prefixes[name]],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split()
                seconds, peak, tokens = float(out[-3]), float(out[-2]), int(out[-1])
                same = same_files(
                    prefixes[name] + "_text_document", prefixes["jsonl"] + "_text_document"
                )
                print(
                    f"| {megabytes:g} | {name} | {seconds:.2f} | {peak:.0f} | {tokens:,} | "
                    f"{'yes' if same else 'NO'} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
