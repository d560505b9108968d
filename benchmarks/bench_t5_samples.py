"""T5 span-corruption samples: epochal's T5Dataset vs Megatron-Core's T5MaskedWordPieceDataset.

The same corpus and timing method as ``bench_bert_samples.py`` (one sentence-split
corpus written by Megatron-Core's builder, a 1,000-piece vocabulary plus [BOS], [EOS]
and 100 sentinels), in the same run and on the same files:

- the sample index build for ``--samples`` samples;
- random sample reads (``ds[i]`` for ``--reads`` random indices, best of ``--repeats``
  rounds after a warm-up round, ours and Megatron's alternating) for each masking
  setup, checking on the way that both give the same samples.

Run::

    python benchmarks/bench_t5_samples.py            # ~2 minutes on a 2-core CPU
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings

import numpy as np

from bench_bert_samples import BenchTokenizer, best_times, write_corpus


class T5BenchTokenizer(BenchTokenizer):
    """The BERT bench vocabulary plus [BOS], [EOS] and 100 ``<extra_id_N>`` sentinels."""

    def __init__(self) -> None:
        super().__init__()
        extra = ["[BOS]", "[EOS]", *(f"<extra_id_{i}>" for i in range(100))]
        for piece in extra:
            self.inv_vocab[len(self.inv_vocab)] = piece
        self.vocab = {p: i for i, p in self.inv_vocab.items()}
        self.vocab_size = len(self.inv_vocab)
        self.bos, self.eos = self.vocab["[BOS]"], self.vocab["[EOS]"]
        self.additional_special_tokens_ids = [self.vocab[f"<extra_id_{i}>"] for i in range(100)]
        self.unique_identifiers = {"class": "T5BenchTokenizer"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--seq-length-decoder", type=int, default=64)
    parser.add_argument("--reads", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch.distributed as dist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset as MIndexed
        from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset as MDataset
        from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDatasetConfig as MConfig
        from megatron.core.datasets.utils import Split

    from epochal.data import IndexedDataset, T5Dataset, T5DatasetConfig
    from epochal.data.datasets.bert_dataset import PERMUTATION_SEED_WORD

    setups = [
        ("Megatron T5 (geometric, 10-grams)", {}),
        ("1/n 3-grams", {"masking_use_geometric_distribution": False, "masking_max_ngram": 3}),
        (
            "permutation",
            {"masking_use_geometric_distribution": False, "masking_do_permutation": True},
        ),
    ]
    tokenizer = T5BenchTokenizer()
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
            f"{int(theirs_low.sequence_lengths.sum()):,} tokens; seq_length {args.seq_length} / "
            f"{args.seq_length_decoder}, {args.samples:,} samples; {args.reads:,} random reads, "
            f"best of {args.repeats}"
        )
        print(
            f"\n{'masking':<36} {'index build ours':>17} {'Megatron':>9} "
            f"{'reads/s ours':>13} {'Megatron':>9} {'ratio':>6}"
        )
        for n, (name, options) in enumerate(setups):
            config = T5DatasetConfig(
                seq_length=args.seq_length,
                seq_length_decoder=args.seq_length_decoder,
                tokenizer=tokenizer,
                data_path=[prefix],
                **options,
            )
            fields = [f for f in vars(config) if f.startswith("masking_")]
            mconfig = MConfig(
                random_seed=config.seed,
                sequence_length=config.seq_length,
                sequence_length_decoder=config.seq_length_decoder,
                split="1",
                tokenizer=tokenizer,
                path_to_cache=os.path.join(tmp, f"megatron-{n}"),
                short_sequence_probability=config.short_sequence_probability,
                **{f: getattr(config, f) for f in fields},
            )
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs = MDataset(theirs_low, prefix, documents, args.samples, Split.train, mconfig)
            t_theirs = time.perf_counter() - start
            start = time.perf_counter()
            ours = T5Dataset(
                ours_low,
                documents,
                args.samples,
                config.seq_length,
                config.seq_length_decoder,
                config.seed,
                tokenizer=tokenizer,
                masking=config.masking,
                short_sequence_probability=config.short_sequence_probability,
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
                f"{name:<36} {t_ours:16.2f}s {t_theirs:8.2f}s "
                f"{r_ours:13,.0f} {r_theirs:9,.0f} {r_ours / r_theirs:5.2f}x"
            )
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
