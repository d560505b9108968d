"""BERT masked-LM samples: epochal's BERTDataset vs Megatron-Core's BERTMaskedWordPieceDataset.

Writes one sentence-split corpus (``--documents`` documents of 1..8 sentences of 3..40
WordPiece ids, a third of them ``##`` continuations; fixed seed) with Megatron-Core's
builder and a 1,000-piece vocabulary, then, in the same run and on the same files, times:

- the sample index build (ours: numpy; Megatron-Core: its compiled ``helpers.build_mapping``)
  for ``--samples`` samples, caches off (ours) / in a fresh folder (Megatron);
- random sample reads (``ds[i]`` for ``--reads`` random indices, best of ``--repeats``
  rounds after a warm-up round, ours and Megatron's alternating) for each masking
  setup, checking on the way that both give the same samples.

Run::

    python benchmarks/bench_bert_samples.py            # ~3 minutes on a 2-core CPU
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np


class BenchTokenizer:
    """The WordPiece tokenizer interface both datasets read (1,000 pieces)."""

    def __init__(self) -> None:
        pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        pieces += [f"w{i}" for i in range(660)] + [f"##p{i}" for i in range(335)]
        self.inv_vocab = dict(enumerate(pieces))
        self.vocab = {p: i for i, p in self.inv_vocab.items()}
        self.vocab_size = len(pieces)
        self.pad, self.cls, self.sep, self.mask = 0, 2, 3, 4
        self.unique_identifiers = {"class": "BenchTokenizer"}


def write_corpus(prefix: str, documents: int, seed: int) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(documents):
        for _ in range(int(rng.integers(1, 9))):
            n = int(rng.integers(3, 41))
            ids = rng.integers(5, 665, size=n)
            pieces = rng.random(n) < 1 / 3
            ids[pieces] = rng.integers(665, 1000, size=int(pieces.sum()))
            ids[0] = rng.integers(5, 665)
            builder.add_item(torch.from_numpy(ids.astype(np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")


def best_times(fns, repeats: int) -> list[float]:
    """Best wall time of each function over ``repeats`` rounds (after a warm-up round);
    the functions alternate within a round, so load changes hit them alike."""
    best = [float("inf")] * len(fns)
    for round_ in range(repeats + 1):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            if round_:
                best[k] = min(best[k], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--reads", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch.distributed as dist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset as MDataset
        from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDatasetConfig as MConfig
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexed
        from megatron.core.datasets.utils import Split

    from epochal.data import BERTDataset, BERTDatasetConfig, IndexedDataset
    from epochal.data.datasets.bert_dataset import PERMUTATION_SEED_WORD

    setups = [
        ("defaults (whole words, 3-grams, NSP)", {}),
        ("no classification head", {"classification_head": False}),
        ("geometric N-grams", {"masking_use_geometric_distribution": True}),
        ("permutation", {"masking_do_permutation": True}),
    ]
    tokenizer = BenchTokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        if not dist.is_initialized():  # Megatron's masked datasets call get_rank()
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        prefix = os.path.join(tmp, "corpus")
        write_corpus(prefix, args.documents, args.seed)
        theirs_low, ours_low = MIndexed(prefix), IndexedDataset(prefix)
        documents = np.arange(theirs_low.document_indices.shape[0] - 1, dtype=np.int32)
        print(
            f"corpus: {args.documents:,} documents, {len(theirs_low):,} sentences, "
            f"{int(theirs_low.sequence_lengths.sum()):,} tokens; seq_length {args.seq_length}, "
            f"{args.samples:,} samples; {args.reads:,} random reads, best of {args.repeats}"
        )
        print(
            f"\n{'masking':<38} {'index build ours':>17} {'Megatron':>9} "
            f"{'reads/s ours':>13} {'Megatron':>9} {'ratio':>6}"
        )
        for n, (name, options) in enumerate(setups):
            config = BERTDatasetConfig(
                seq_length=args.seq_length, tokenizer=tokenizer, data_path=[prefix], **options
            )
            fields = [f for f in vars(config) if f.startswith("masking_")]
            mconfig = MConfig(
                random_seed=config.seed,
                sequence_length=config.seq_length,
                split="1",
                tokenizer=tokenizer,
                path_to_cache=os.path.join(tmp, f"megatron-{n}"),
                short_sequence_probability=config.short_sequence_probability,
                classification_head=config.classification_head,
                **{f: getattr(config, f) for f in fields},
            )
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = MDataset(theirs_low, prefix, documents, args.samples, Split.train, mconfig)
            t_theirs = time.perf_counter() - start
            start = time.perf_counter()
            ours = BERTDataset(
                ours_low,
                documents,
                args.samples,
                config.seq_length,
                config.seed,
                tokenizer=tokenizer,
                masking=config.masking,
                short_sequence_probability=config.short_sequence_probability,
                classification_head=config.classification_head,
            )
            t_ours = time.perf_counter() - start
            rng = np.random.default_rng(args.seed + n)
            indices = rng.integers(0, len(ours), size=args.reads).tolist()
            for i in indices[:200]:  # same samples (Megatron's permutation reads the global RNG)
                np.random.seed([config.seed, i, PERMUTATION_SEED_WORD])  # noqa: NPY002
                a, b = ours[i], theirs[i]
                assert all(np.array_equal(a[k], b[k]) for k in b), (name, i)

            def read(ds, indices=indices) -> None:
                for i in indices:
                    ds[i]

            t_read_ours, t_read_theirs = best_times(
                [lambda ds=ours: read(ds), lambda ds=theirs: read(ds)], args.repeats
            )
            r_ours, r_theirs = args.reads / t_read_ours, args.reads / t_read_theirs
            print(
                f"{name:<38} {t_ours:16.2f}s {t_theirs:8.2f}s "
                f"{r_ours:13,.0f} {r_theirs:9,.0f} {r_ours / r_theirs:5.2f}x"
            )
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
