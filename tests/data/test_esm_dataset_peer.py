"""ESMMaskedResidueDataset against BioNeMo's (the real bionemo-llm masking and bionemo-core
resampler; bionemo-esm2's dataset.py transcribed in tests/data/bionemo_reference.py):
the same tensors for every EpochIndex, seed, crop length and random-mask strategy.

Needs ``pip install --no-deps bionemo-core bionemo-llm`` and ``transformers``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from epochal.data import (
    EpochIndex,
    ESMMaskedResidueDataset,
    create_train_dataset,
    proteins_to_bionemo_layout,
    read_aaanalysis_proteins,
)
from epochal.data.proteins.database import ProteinSQLiteDataset
from tests.data.esm_vocab import REAL_PROTEINS, synthetic_proteins

pytestmark = pytest.mark.peer

pytest.importorskip("transformers")
pytest.importorskip("bionemo.llm.data.masking")
ref = pytest.importorskip("tests.data.bionemo_reference")

FIELDS = ("text", "types", "attention_mask", "labels", "loss_mask", "is_random")


def assert_same_sample(ours: dict, theirs: dict, key) -> None:
    assert set(ours) == set(theirs) == set(FIELDS), key
    for name in FIELDS:
        a, b = ours[name], theirs[name]
        assert a.dtype == b.dtype and a.shape == b.shape, (key, name, a.dtype, b.dtype)
        assert torch.equal(a, b), (key, name, a, b)


def make_clusters(ids: list[str], seed: int) -> list[list[str]]:
    """Clusters of 1 to 6 members, one empty-free partition of ``ids``."""
    rng = np.random.default_rng(seed)
    clusters, start = [], 0
    while start < len(ids):
        size = int(rng.integers(1, 7))
        clusters.append(ids[start : start + size])
        start += size
    return clusters


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    return ref.esm_tokenizer(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def proteins():
    proteins = synthetic_proteins(60, seed=7, max_length=260)
    proteins.update({f"REAL{i}": s for i, s in enumerate(REAL_PROTEINS)})
    # raw database text BioNeMo reads unchecked: lower case, spaces, specials, J
    proteins.update({"odd0": "mkta", "odd1": "MK TA", "odd2": "MK<mask>TAJ", "odd3": "M"})
    return proteins


@pytest.mark.parametrize("strategy", ["all_tokens", "amino_acids_only"])
@pytest.mark.parametrize("max_seq_length", [1, 3, 17, 64, 1024])
def test_samples_equal_bionemo(proteins, hf_tokenizer, strategy, max_seq_length):
    clusters = make_clusters(sorted(proteins), seed=max_seq_length)
    for seed in (0, 1, 1234, 2**40 + 3):
        kwargs = dict(seed=seed, max_seq_length=max_seq_length)
        ours = ESMMaskedResidueDataset(proteins, clusters, random_mask_strategy=strategy, **kwargs)
        theirs = ref.ESMMaskedResidueDataset(
            proteins,
            clusters,
            random_mask_strategy=ref.RandomMaskStrategy(strategy),
            tokenizer=hf_tokenizer,
            **kwargs,
        )
        assert len(ours) == len(theirs) == len(clusters)
        for epoch in (0, 1, 5, 10**6):
            for idx in range(len(clusters)):
                key = EpochIndex(epoch, idx)
                assert_same_sample(ours[key], theirs[ref.EpochIndex(epoch, idx)], (seed, key))


@pytest.mark.parametrize(
    "probs", [(0.5, 0.8, 0.1), (0.3, 0.5, 0.5), (1.0, 0.0, 1.0), (0.15, 1.0, 0.0), (0.0, 0.8, 0.1)]
)
def test_mask_probabilities_equal_bionemo(proteins, hf_tokenizer, probs):
    mask_prob, token_prob, random_prob = probs
    clusters = [[name] for name in sorted(proteins)]
    kwargs = dict(
        seed=99,
        max_seq_length=128,
        mask_prob=mask_prob,
        mask_token_prob=token_prob,
        mask_random_prob=random_prob,
    )
    ours = ESMMaskedResidueDataset(proteins, clusters, **kwargs)
    theirs = ref.ESMMaskedResidueDataset(proteins, clusters, tokenizer=hf_tokenizer, **kwargs)
    for idx in range(len(clusters)):
        for epoch in (0, 3):
            key = (epoch, idx)
            assert_same_sample(ours[EpochIndex(*key)], theirs[ref.EpochIndex(*key)], key)


def _write_inputs(folder, proteins, clusters):
    fasta = folder / "proteins.fasta"
    fasta.write_text("".join(f">{k} some description\n{v}\n" for k, v in proteins.items()))
    tsv = folder / "clusters.tsv"
    tsv.write_text("".join(f"{c[0]}\t{m}\n" for c in clusters for m in c))
    return fasta, tsv


def test_create_train_dataset_reads_what_bionemo_reads(tmp_path, hf_tokenizer):
    proteins = synthetic_proteins(45, seed=3, max_length=120)
    clusters = make_clusters(list(proteins), seed=5)
    fasta, tsv = _write_inputs(tmp_path, proteins, clusters)
    layout = proteins_to_bionemo_layout(fasta, tmp_path / "layout", clusters=tsv)
    n = len(clusters)
    ours = create_train_dataset(layout.train_clusters, layout.database, 3 * n, seed=11)
    theirs = ref.create_train_dataset(
        layout.train_clusters, layout.database, 3 * n, 11, tokenizer=hf_tokenizer
    )
    assert len(ours) == len(theirs) == 3 * n
    ours_db, theirs_db = (
        ProteinSQLiteDataset(layout.database),
        ref.ProteinSQLiteDataset(layout.database),
    )
    assert len(ours_db) == len(theirs_db) == len(proteins)
    for name, sequence in proteins.items():
        assert ours_db[name] == theirs_db[name] == sequence
    for epoch in range(3):
        for idx in range(n):
            key = (epoch, idx)
            assert_same_sample(
                ours.dataset[EpochIndex(*key)], theirs.dataset[ref.EpochIndex(*key)], key
            )
    # both resamplers serve every cluster once per epoch (in their own orders)
    for epoch in range(3):
        served = [ours[g] for g in range(epoch * n, (epoch + 1) * n)]
        expected = [theirs.dataset[ref.EpochIndex(epoch, i)] for i in range(n)]
        assert sorted(s["text"].tolist() for s in served) == sorted(
            s["text"].tolist() for s in expected
        )


def test_real_proteins_equal_bionemo(hf_tokenizer):
    records = read_aaanalysis_proteins(["SEQ_AMYLO", "SEQ_DISULFIDE"])
    if records is None:
        pytest.skip("aaanalysis is not installed (pip install --no-deps aaanalysis)")
    proteins = {name: sequence for name, sequence, _ in records}
    names = sorted(proteins)[::7]
    clusters = make_clusters(names, seed=1)
    for max_seq_length in (32, 512):
        for strategy in ("all_tokens", "amino_acids_only"):
            kwargs = dict(seed=2024, max_seq_length=max_seq_length)
            ours = ESMMaskedResidueDataset(
                proteins, clusters, random_mask_strategy=strategy, **kwargs
            )
            theirs = ref.ESMMaskedResidueDataset(
                proteins,
                clusters,
                random_mask_strategy=ref.RandomMaskStrategy(strategy),
                tokenizer=hf_tokenizer,
                **kwargs,
            )
            for idx in range(0, len(clusters), 3):
                key = (idx % 4, idx)
                assert_same_sample(ours[EpochIndex(*key)], theirs[ref.EpochIndex(*key)], key)


@pytest.mark.parametrize("lengths", [(None, None), (64, 64), (None, 20), (30, None), (8, 100)])
def test_collate_equals_bionemo(proteins, lengths):
    from bionemo.llm.data.collate import bert_padding_collate_fn as theirs

    from epochal.data import bert_padding_collate_fn as ours

    min_length, max_length = lengths
    clusters = [[name] for name in sorted(proteins)]
    dataset = ESMMaskedResidueDataset(proteins, clusters, seed=8, max_seq_length=50)
    for start in range(0, len(clusters), 7):
        batch = [dataset[EpochIndex(1, i)] for i in range(start, min(start + 7, len(clusters)))]
        a = ours(batch, padding_value=1, min_length=min_length, max_length=max_length)
        b = theirs(batch, padding_value=1, min_length=min_length, max_length=max_length)
        assert_same_sample(a, b, (start, lengths))
    assert ours([], padding_value=1) == theirs([], padding_value=1) == {}
    with pytest.raises(ValueError, match="All keys in inputs must match"):
        ours([{"text": torch.ones(2)}, {"labels": torch.ones(2)}], padding_value=1)
