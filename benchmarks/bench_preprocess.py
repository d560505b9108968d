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

With ``--split-sentences`` (Megatron's BERT preprocessing) the tokenizer is BERT
WordPiece (lower case; a 30,522-token vocabulary trained on the corpus first, not
timed) and every document is split into sentences, one sequence each, without EOD:

- ours: ``preprocess(..., split_sentences=True)`` with :class:`BertWordPieceTokenizer`;
- baseline: Megatron's ``Encoder.encode`` with its splitter, per line: ``json.loads``,
  ``splitter.tokenize(text)``, one tokenizer call per sentence with transformers'
  ``BertTokenizer`` (its Rust-backed class; Megatron's own ``FullBertTokenizer`` is
  pure Python and slower), ``add_document`` with the sentence lengths. Both use the
  same splitter (nltk's Punkt when its data is installed, else epochal's rule-based
  one), so the outputs can be compared byte for byte.

Both runs must produce byte-identical files; the script checks it. Tokenizers run on
one thread per worker (``TOKENIZERS_PARALLELISM=false``), so "N workers" means N cores
for both. Run::

    python benchmarks/bench_preprocess.py                     # ~1-2 minutes
    python benchmarks/bench_preprocess.py --split-sentences   # BERT, ~2 minutes

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


def bert_vocab(tokenizer_dir: str) -> str:
    return os.path.join(tokenizer_dir, "vocab.txt")


def reference_tokenizer(tokenizer_dir: str, bert: bool):
    """transformers' GPT2Tokenizer, or BertTokenizer (lower case) for ``--split-sentences``."""
    from transformers import BertTokenizer, GPT2Tokenizer

    if bert:
        return BertTokenizer(bert_vocab(tokenizer_dir), do_lower_case=True)
    return GPT2Tokenizer.from_pretrained(tokenizer_dir)


class MegatronStyleEncoder:
    """``Encoder`` of Megatron-LM's tools/preprocess_data.py (with ``bert``: its
    ``--split-sentences`` path, no ``--append-eod``)."""

    def __init__(self, tokenizer_dir: str, bert: bool = False) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.bert = bert

    def initializer(self) -> None:
        from epochal.data import SentenceSplitter

        MegatronStyleEncoder.tokenizer = reference_tokenizer(self.tokenizer_dir, self.bert)
        MegatronStyleEncoder.splitter = SentenceSplitter() if self.bert else None

    def encode(self, json_line: str):
        data = json.loads(json_line)
        text = data["text"]
        tokenizer, splitter = MegatronStyleEncoder.tokenizer, MegatronStyleEncoder.splitter
        if splitter is not None:
            max_len = 1000000  # Megatron splits text in pieces of this many characters
            sentences = [
                s
                for i in range(0, len(text), max_len)
                for s in splitter.tokenize(text[i : i + max_len])
            ]
        else:
            sentences = [text] if isinstance(text, str) else text
        doc_ids, sentence_lens = [], []
        for sentence in sentences:
            ids = tokenizer.encode(sentence, add_special_tokens=False)
            if ids:
                doc_ids.extend(ids)
                sentence_lens.append(len(ids))
        if doc_ids and not self.bert:  # --append-eod
            doc_ids.append(tokenizer.eos_token_id)
            sentence_lens[-1] += 1
        return doc_ids, sentence_lens, len(json_line)


def run_baseline(
    input_path: str, output_prefix: str, tokenizer_dir: str, workers: int, bert: bool
) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    tokenizer = reference_tokenizer(tokenizer_dir, bert)
    encoder = MegatronStyleEncoder(tokenizer_dir, bert)
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


def run_ours(
    input_path: str, output_prefix: str, tokenizer_dir: str, workers: int, bert: bool
) -> int:
    if bert:
        tokenizer = build_tokenizer("BertWordPieceLowerCase", vocab_file=bert_vocab(tokenizer_dir))
    else:
        tokenizer = build_tokenizer("GPT2BPETokenizer")
    summary = preprocess(
        input_path,
        output_prefix,
        tokenizer,
        append_eod=not bert,
        split_sentences=bert,
        workers=workers,
    )
    return summary.total_tokens


def same_files(a: str, b: str) -> bool:
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as x, open(b + ext, "rb") as y:
            if x.read() != y.read():
                return False
    return True


def measure_one(
    impl: str, corpus: str, prefix: str, tokenizer_dir: str, workers: int, bert: bool
) -> None:
    """Time one run in this (fresh) process and print ``seconds tokens`` (imports not timed)."""
    # Import time is not preprocessing time: load both reference packages first
    # (Megatron-Core's first import alone takes seconds).
    from transformers import GPT2Tokenizer  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.datasets.indexed_dataset  # noqa: F401
    start = time.perf_counter()
    if impl == "baseline":
        tokens = run_baseline(corpus, prefix, tokenizer_dir, workers, bert)
    else:
        tokens = run_ours(corpus, prefix, tokenizer_dir, workers, bert)
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
    parser.add_argument(
        "--split-sentences",
        action="store_true",
        help="BERT WordPiece with sentence splitting (Megatron's BERT preprocessing)",
    )
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)  # internal: one timed run
    args = parser.parse_args()
    if args.one:
        impl, corpus, prefix, tokenizer_dir, workers, bert = args.one
        measure_one(impl, corpus, prefix, tokenizer_dir, int(workers), bert == "1")
        return
    bert = "1" if args.split_sentences else "0"

    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        documents, text_bytes = write_corpus(corpus, args.megabytes, args.doc_bytes)
        tokenizer_dir = os.path.join(tmp, "gpt2")
        os.makedirs(tokenizer_dir)
        vocab, merges = find_gpt2_bpe_files()
        shutil.copy(vocab, os.path.join(tokenizer_dir, "vocab.json"))
        shutil.copy(merges, os.path.join(tokenizer_dir, "merges.txt"))
        if args.split_sentences:
            from epochal.data import SentenceSplitter, train_wordpiece

            with open(corpus, encoding="utf-8") as stream:
                train_wordpiece(
                    (json.loads(line)["text"] for line in stream), 30522, bert_vocab(tokenizer_dir)
                )
            setting = f"BERT WordPiece (lower case), --split-sentences ({SentenceSplitter()!r})"
        else:
            setting = "GPT-2 BPE, --append-eod"
        print(
            f"corpus: {documents:,} documents, {text_bytes / 1e6:.1f} MB of text (standard-library sources); "
            f"{setting}; {os.cpu_count()} CPUs; each run in a fresh process"
        )
        print(
            f"\n{'workers':>7}  {'implementation':<34} {'seconds':>8} {'docs/s':>9} {'tokens/s':>11} {'speed-up':>9}"
        )
        for workers in args.workers:
            base_prefix = os.path.join(tmp, f"base{workers}")
            our_prefix = os.path.join(tmp, f"ours{workers}")
            base, base_tokens = timed_in_fresh_process(
                "baseline", corpus, base_prefix, tokenizer_dir, str(workers), bert
            )
            ours, our_tokens = timed_in_fresh_process(
                "ours", corpus, our_prefix, tokenizer_dir, str(workers), bert
            )
            level = "sentence" if args.split_sentences else "document"
            identical = same_files(base_prefix, f"{our_prefix}_text_{level}")
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
