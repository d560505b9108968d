"""ESMMaskedResidueDataset's own behaviour: determinism under Megatron's contract, fresh
members and masks every epoch, BioNeMo's crop window, options and errors, the builders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochal.data import (
    EpochIndex,
    ESMMaskedResidueDataset,
    MultiEpochDatasetResampler,
    ProteinInputError,
    RandomMaskStrategy,
    build_esm_datasets,
    proteins_to_bionemo_layout,
)
from epochal.testing import (
    assert_dataset_compatible_with_megatron,
    assert_dataset_elements_not_equal,
    assert_samples_equal,
)
from tests.data.esm_vocab import synthetic_proteins

CLS, EOS, MASK = 0, 2, 32


class Recording(dict):
    """A protein dict that records the ids read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.keys_read = []

    def __getitem__(self, key):
        self.keys_read.append(key)
        return super().__getitem__(key)


@pytest.fixture(scope="module")
def proteins():
    return synthetic_proteins(40, seed=1, max_length=200)


@pytest.fixture(scope="module")
def clusters(proteins):
    names = sorted(proteins)
    return [names[i : i + 4] for i in range(0, len(names), 4)]


def test_megatron_contract_and_fresh_samples_every_epoch(tmp_path, proteins, clusters):
    fasta = tmp_path / "p.fasta"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in proteins.items()))
    tsv = tmp_path / "c.tsv"
    tsv.write_text("".join(f"{c[0]}\t{m}\n" for c in clusters for m in c))
    layout = proteins_to_bionemo_layout(fasta, tmp_path / "layout", clusters=tsv, num_valid=2)
    train, valid = build_esm_datasets(
        layout.train_clusters,
        layout.database,
        train_samples=50,
        seed=5,
        valid_cluster_path=layout.valid_clusters,
        max_seq_length=64,
    )
    assert isinstance(train, MultiEpochDatasetResampler) and len(train) == 50
    assert len(train.dataset) == 8 and len(valid) == len(valid.dataset) == 2
    assert_dataset_compatible_with_megatron(train, 17, check_other_process=True)
    assert_dataset_compatible_with_megatron(valid, 1)
    dataset = train.dataset
    for idx in range(len(dataset)):
        assert_dataset_elements_not_equal(dataset, EpochIndex(0, idx), EpochIndex(1, idx))
    # over epochs, a cluster draws each of its members
    reads = Recording(proteins)
    recorded = ESMMaskedResidueDataset(reads, dataset.clusters, seed=5, max_seq_length=64)
    for epoch in range(40):
        assert_samples_equal(recorded[EpochIndex(epoch, 0)], dataset[EpochIndex(epoch, 0)])
    assert set(reads.keys_read) == set(dataset.clusters[0]) and len(dataset.clusters[0]) == 4
    # validation clusters are their representatives only
    for idx in range(2):
        (rep,) = valid.dataset.clusters[idx]
        sample = valid.dataset[EpochIndex(0, idx)]
        assert sample["text"].numel() == min(len(proteins[rep]) + 2, 64)


def test_sample_fields_and_crop_window(proteins):
    long = {"L": "".join(np.random.default_rng(0).choice(list("ACDEFGHIKLMNPQRSTVWY"), 50))}
    dataset = ESMMaskedResidueDataset(long, [["L"]], seed=0, max_seq_length=10, mask_prob=0.0)
    starts = set()
    for epoch in range(400):
        sample = dataset[EpochIndex(epoch, 0)]
        text = sample["text"]
        assert text.shape == (10,) and text.dtype == torch.int64
        assert sample["loss_mask"].dtype == torch.bool and not sample["loss_mask"].any()
        assert torch.equal(sample["labels"], torch.full((10,), -100))
        assert torch.equal(sample["attention_mask"], torch.ones(10, dtype=torch.int64))
        assert not sample["types"].any() and not sample["is_random"].any()
        assert EOS not in text.tolist()  # BioNeMo's window never reaches the last token
        full = dataset.tokenize(long["L"])
        start = next(s for s in range(43) if torch.equal(full[s : s + 10], text))
        starts.add(start)
        assert (text[0] == CLS) == (start == 0)
    assert starts == set(range(42))  # 52 tokens, windows of 10: starts 0..41, never 42
    short = ESMMaskedResidueDataset({"S": "MKT"}, [["S"]], seed=0, mask_prob=0.0)
    assert short[EpochIndex(0, 0)]["text"].tolist() == [CLS, 20, 15, 11, EOS]


def test_masking_rates_and_strategies(proteins, clusters):
    for strategy, allowed in [
        ("all_tokens", set(range(33))),
        ("amino_acids_only", set(range(4, 24))),
    ]:
        dataset = ESMMaskedResidueDataset(
            proteins,
            clusters,
            seed=3,
            mask_prob=0.5,
            mask_token_prob=0.0,
            mask_random_prob=1.0,
            random_mask_strategy=strategy,
        )
        replaced = torch.cat(
            [
                s["text"][s["loss_mask"]]
                for s in (dataset[EpochIndex(e, i)] for e in range(3) for i in range(10))
            ]
        )
        assert set(replaced.tolist()) <= allowed and len(set(replaced.tolist())) > len(allowed) // 2
    dataset = ESMMaskedResidueDataset(proteins, clusters, seed=3, max_seq_length=256)
    samples = [dataset[EpochIndex(e, i)] for e in range(5) for i in range(10)]
    selected = torch.cat([s["loss_mask"][1:-1] for s in samples]).float().mean().item()
    masked = torch.cat([s["text"][s["loss_mask"]] == MASK for s in samples]).float().mean().item()
    assert 0.12 < selected < 0.18 and 0.7 < masked < 0.9
    reads = Recording(proteins)
    recorded = ESMMaskedResidueDataset(reads, clusters, seed=3, max_seq_length=256)
    for i in range(10):
        sample = recorded[EpochIndex(0, i)]
        original = recorded.tokenize(proteins[reads.keys_read[-1]])
        assert not sample["loss_mask"][0] and not sample["loss_mask"][-1]  # <cls>, <eos>
        kept = ~sample["loss_mask"]
        assert torch.equal(sample["text"][kept], original[kept])
        assert torch.equal(sample["labels"][sample["loss_mask"]], original[sample["loss_mask"]])


def test_options_and_errors(proteins, clusters):
    assert RandomMaskStrategy("amino_acids_only") is RandomMaskStrategy.AMINO_ACIDS_ONLY
    for kwargs, message in [
        (dict(seed=-1), "seed must be >= 0"),
        (dict(seed=0, max_seq_length=0), "max_seq_length must be >= 1"),
        (dict(seed=0, mask_prob=1.5), r"mask_prob must be in \[0, 1\]"),
        (dict(seed=0, mask_token_prob=0.8, mask_random_prob=0.3), "must be <= 1.0"),
        (dict(seed=0, random_mask_strategy="some"), "random_mask_strategy must be one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            ESMMaskedResidueDataset(proteins, clusters, **kwargs)
    dataset = ESMMaskedResidueDataset({"A": "MK"}, [["A"], [], ["B"]], seed=0)
    with pytest.raises(ValueError, match="Cluster 1 is empty"):
        dataset[EpochIndex(0, 1)]
    with pytest.raises(KeyError, match="B"):
        dataset[EpochIndex(0, 2)]
    with pytest.raises(IndexError):
        dataset[EpochIndex(0, 3)]
    with pytest.raises(TypeError, match="EpochIndex"):
        dataset[0]


def test_builders_check_files(tmp_path, proteins):
    fasta = tmp_path / "p.fasta"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in list(proteins.items())[:6]))
    layout = proteins_to_bionemo_layout(fasta, tmp_path / "l")
    with pytest.raises(ProteinInputError, match="nope.parquet: training cluster file not found"):
        build_esm_datasets(tmp_path / "nope.parquet", layout.database, train_samples=4, seed=0)
    with pytest.raises(ProteinInputError, match="Database file .*none.sqlite not found"):
        build_esm_datasets(layout.train_clusters, tmp_path / "none.sqlite", train_samples=4, seed=0)
    other = proteins_to_bionemo_layout(fasta.parent / "p.fasta", tmp_path / "l2", num_valid=1)
    import pandas as pd

    pd.DataFrame({"ur90_id": [["P0", "ghost"]]}).to_parquet(tmp_path / "g.parquet")
    with pytest.raises(
        ProteinInputError, match=r"g.parquet: 1 cluster member\(s\) not in the database .*'ghost'"
    ):
        build_esm_datasets(tmp_path / "g.parquet", other.database, train_samples=4, seed=0)


def test_member_names_the_protein_each_sample_reads(proteins, clusters):
    reads = Recording(proteins)
    dataset = ESMMaskedResidueDataset(reads, clusters, seed=3, max_seq_length=64)
    for epoch in range(6):
        for idx in range(len(clusters)):
            reads.keys_read.clear()
            dataset[EpochIndex(epoch, idx)]
            assert dataset.member(EpochIndex(epoch, idx)) == (reads.keys_read[-1], 4)
