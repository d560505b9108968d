"""Preprocessing throughput: ``epochal preprocess`` vs Megatron's ``tools/preprocess_data.py`` logic.

Builds a JSONL corpus of ``--megabytes`` of text (Python standard-library sources cut
into documents of about ``--doc-bytes`` at blank lines, in sorted file order), then
tokenizes it with GPT-2 BPE (``--append-eod``) into ``.bin``/``.idx`` with 1 and 2
workers (``--workers``), timing end to end (tokenizer construction, worker start-up,
reading, writing):

- ours: :func:`epochal.data.preprocess.preprocess` (chunks of 1 MiB tokenized in one
  batch call per chunk; GPT-2's files run on the tiktoken engine);
- baseline: what Megatron-LM's ``tools/preprocess_data.py`` does (its script needs
  ``megatron.training``, which the PyPI package lacks, so its logic is reproduced here):
  ``multiprocessing.Pool(workers).imap(encode, lines, 32)``, one ``json.loads`` and one
  tokenizer call per line with Hugging Face transformers' ``GPT2Tokenizer`` (what
  Megatron-Core's ``GPT2BPETokenizer`` wraps; we call its faster ``encode`` rather than
  Megatron's ``tokenize`` + ``convert_tokens_to_ids``), Megatron-Core's
  ``IndexedDatasetBuilder.add_document``.

Both runs must produce byte-identical files; the script checks it. Tokenizers run on
one thread per worker (``TOKENIZERS_PARALLELISM=false``), so "N workers" means N cores
for both. Run::

    python benchmarks/bench_preprocess.py             # ~1-2 minutes

Each timed run happens in a fresh interpreter (imports done before the clock starts),
so no run inherits another's warm caches, pools or memory.
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import glob  # noqa: E402
import json  # noqa: E402
import multiprocessing  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

from epochal.data import build_tokenizer, find_gpt2_bpe_files  # noqa: E402
from epochal.data.indexed.preprocess import preprocess  # noqa: E402


def write_corpus(path: str, megabytes: float, doc_bytes: int) -> tuple[int, int]:
    """Write standard-library sources as JSONL documents; return (documents, bytes of text)."""
    limit = int(megabytes * 1e6)
    sources = sorted(
        glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)
    )
    documents = written = 0
    with open(path, "w", encoding="utf-8") as out:
        for source in sources:
            with open(source, encoding="utf-8", errors="replace") as stream:
                text = stream.read()
            current = ""
            for paragraph in text.split("\n\n"):
                current += paragraph + "\n\n"
                if len(current) >= doc_bytes:
                    out.write(json.dumps({"text": current}) + "\n")
                    documents, written, current = documents + 1, written + len(current), ""
                    if written >= limit:
                        return documents, written
    return documents, written


class MegatronStyleEncoder:
    """``Encoder`` of Megatron-LM's tools/preprocess_data.py (no sentence splitting)."""

    def __init__(self, tokenizer_dir: str) -> None:
        self.tokenizer_dir = tokenizer_dir

    def initializer(self) -> None:
        from transformers import GPT2Tokenizer

        MegatronStyleEncoder.tokenizer = GPT2Tokenizer.from_pretrained(self.tokenizer_dir)

    def encode(self, json_line: str):
        data = json.loads(json_line)
        text = data["text"]
        doc_ids, sentence_lens = [], []
        for sentence in [text] if isinstance(text, str) else text:
            ids = MegatronStyleEncoder.tokenizer.encode(sentence)
            if ids:
                doc_ids.extend(ids)
                sentence_lens.append(len(ids))
        if doc_ids:
            doc_ids.append(MegatronStyleEncoder.tokenizer.eos_token_id)
            sentence_lens[-1] += 1
        return doc_ids, sentence_lens, len(json_line)


def run_baseline(input_path: str, output_prefix: str, tokenizer_dir: str, workers: int) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from transformers import GPT2Tokenizer

    tokenizer = GPT2Tokenizer.from_pretrained(tokenizer_dir)
    encoder = MegatronStyleEncoder(tokenizer_dir)
    builder = IndexedDatasetBuilder(
        output_prefix + ".bin", dtype=DType.optimal_dtype(len(tokenizer))
    )
    tokens = 0
    with (
        open(input_path, encoding="utf-8") as fin,
        multiprocessing.Pool(workers, initializer=encoder.initializer) as pool,
    ):
        for doc, lens, _ in pool.imap(encoder.encode, fin, 32):
            builder.add_document(doc, lens)
            tokens += len(doc)
    builder.finalize(output_prefix + ".idx")
    return tokens


def run_ours(input_path: str, output_prefix: str, workers: int) -> int:
    tokenizer = build_tokenizer("GPT2BPETokenizer")
    summary = preprocess(input_path, output_prefix, tokenizer, append_eod=True, workers=workers)
    return summary.total_tokens


def same_files(a: str, b: str) -> bool:
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as x, open(b + ext, "rb") as y:
            if x.read() != y.read():
                return False
    return True


def measure_one(impl: str, corpus: str, prefix: str, tokenizer_dir: str, workers: int) -> None:
    """Time one run in this (fresh) process and print ``seconds tokens`` (imports not timed)."""
    # Import time is not preprocessing time: load both reference packages first
    # (Megatron-Core's first import alone takes seconds).
    from transformers import GPT2Tokenizer  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.datasets.indexed_dataset  # noqa: F401
    start = time.perf_counter()
    if impl == "baseline":
        tokens = run_baseline(corpus, prefix, tokenizer_dir, workers)
    else:
        tokens = run_ours(corpus, prefix, workers)
    print(f"{time.perf_counter() - start} {tokens}")


def timed_in_fresh_process(*args: str) -> tuple[float, int]:
    """Run :func:`measure_one` in a new interpreter, so no run inherits another's state."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", *args], check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[-2]), int(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--megabytes",
        type=float,
        default=24.0,
        help="text in the corpus (default 24; below ~10 MB worker start-up dominates)",
    )
    parser.add_argument(
        "--doc-bytes", type=int, default=2000, help="approximate document size (default 2000)"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # internal: one timed run
    args = parser.parse_args()
    if args.one:
        impl, corpus, prefix, tokenizer_dir, workers = args.one
        measure_one(impl, corpus, prefix, tokenizer_dir, int(workers))
        return

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        documents, text_bytes = write_corpus(corpus, args.megabytes, args.doc_bytes)
        tokenizer_dir = os.path.join(tmp, "gpt2")
        os.makedirs(tokenizer_dir)
        vocab, merges = find_gpt2_bpe_files()
        shutil.copy(vocab, os.path.join(tokenizer_dir, "vocab.json"))
        shutil.copy(merges, os.path.join(tokenizer_dir, "merges.txt"))
        print(
            f"corpus: {documents:,} documents, {text_bytes / 1e6:.1f} MB of text (standard-library sources); "
            f"GPT-2 BPE, --append-eod; {os.cpu_count()} CPUs; each run in a fresh process"
        )
        print(
            f"\n{'workers':>7}  {'implementation':<34} {'seconds':>8} {'docs/s':>9} {'tokens/s':>11} {'speed-up':>9}"
        )
        for workers in args.workers:
            base_prefix = os.path.join(tmp, f"base{workers}")
            our_prefix = os.path.join(tmp, f"ours{workers}")
            base, base_tokens = timed_in_fresh_process(
                "baseline", corpus, base_prefix, tokenizer_dir, str(workers)
            )
            ours, our_tokens = timed_in_fresh_process(
                "ours", corpus, our_prefix, tokenizer_dir, str(workers)
            )
            identical = same_files(base_prefix, f"{our_prefix}_text_document")
            assert base_tokens == our_tokens and identical, "outputs differ"
            for name, seconds, speedup in (
                ("Megatron preprocess_data.py logic", base, ""),
                ("epochal preprocess", ours, f"{base / ours:8.1f}x"),
            ):
                print(
                    f"{workers:>7}  {name:<34} {seconds:8.2f} {documents / seconds:9,.0f} "
                    f"{our_tokens / seconds:11,.0f} {speedup:>9}"
                )
        print("\noutputs byte-identical between the two implementations: yes")


if __name__ == "__main__":
    main()
