"""BioNeMo's ESM-2 dataset, for the peer tests: the real bionemo-llm / bionemo-core code.

bionemo-esm2 is not on PyPI, so its ``ESMMaskedResidueDataset``,
``ProteinSQLiteDataset``, ``_random_crop`` and ``create_train_dataset`` are
transcribed below statement by statement from
``sub-packages/bionemo-esm2/src/bionemo/esm2/data/dataset.py`` at commit
``bf10c4d7b238df0ad48942f92ad1880001f243ca`` of NVIDIA/bionemo-framework
(docstrings dropped; the tokenizer is ``transformers.EsmTokenizer`` on ESM-2's
``vocab.txt``, which is what ``BioNeMoESMTokenizer`` wraps). Everything it calls is
the real code, imported from the PyPI wheels (identical to that commit):
``bionemo.llm.data.masking`` (``BertMaskConfig``, ``apply_bert_pretraining_mask``),
``bionemo.core.utils.random_utils.get_seed_from_rng`` and
``bionemo.core.data.multi_epoch_dataset`` (``EpochIndex``, ``MultiEpochDatasetResampler``).

Their dependencies (NeMo, Megatron, ngcsdk) are not needed for these modules:
``pip install --no-deps bionemo-core bionemo-llm``. Import this module only after
``pytest.importorskip("bionemo.llm.data.masking")``.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from enum import Enum
from pathlib import Path

os.environ.setdefault("BIONEMO_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bionemo-cache"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from bionemo.core.data.multi_epoch_dataset import (  # noqa: E402
    EpochIndex,
    MultiEpochDatasetResampler,
)
from bionemo.core.utils import random_utils  # noqa: E402
from bionemo.llm.data import masking  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from tests.data.esm_vocab import ESM2_VOCAB_TXT  # noqa: E402

__all__ = [
    "EpochIndex",
    "ESMMaskedResidueDataset",
    "ProteinSQLiteDataset",
    "RandomMaskStrategy",
    "create_train_dataset",
    "esm_tokenizer",
]


def esm_tokenizer(folder: str | os.PathLike):
    """``transformers.EsmTokenizer`` on ESM-2's vocab.txt (BioNeMo's tokenizer), written to ``folder``."""
    import transformers

    vocab = Path(folder) / "vocab.txt"
    vocab.write_text(ESM2_VOCAB_TXT)
    return transformers.EsmTokenizer(str(vocab))


class RandomMaskStrategy(str, Enum):  # noqa: UP042 - as BioNeMo
    AMINO_ACIDS_ONLY = "amino_acids_only"
    ALL_TOKENS = "all_tokens"


class ProteinSQLiteDataset(Dataset):
    def __init__(self, db_path):
        self.conn = sqlite3.connect(str(db_path))
        self.cursor = self.conn.cursor()
        self._len = None

    def __len__(self):
        if self._len is None:
            self.cursor.execute("SELECT COUNT(*) FROM protein")
            self._len = int(self.cursor.fetchone()[0])
        return self._len

    def __getitem__(self, idx):
        if not isinstance(idx, str):
            raise TypeError(f"Expected string, got {type(idx)}: {idx}.")

        self.cursor.execute("SELECT sequence FROM protein WHERE id = ?", (idx,))
        return self.cursor.fetchone()[0]


class ESMMaskedResidueDataset(Dataset):
    def __init__(
        self,
        protein_dataset,
        clusters,
        seed,
        max_seq_length=1024,
        mask_prob=0.15,
        mask_token_prob=0.8,
        mask_random_prob=0.1,
        random_mask_strategy=RandomMaskStrategy.ALL_TOKENS,
        tokenizer=None,
    ):
        self.protein_dataset = protein_dataset
        self.clusters = clusters
        self.seed = seed
        self.max_seq_length = max_seq_length
        self.random_mask_strategy = random_mask_strategy

        if tokenizer.mask_token_id is None:
            raise ValueError("Tokenizer does not have a mask token.")

        self.mask_config = masking.BertMaskConfig(
            tokenizer=tokenizer,
            random_tokens=range(len(tokenizer.all_tokens))
            if self.random_mask_strategy == RandomMaskStrategy.ALL_TOKENS
            else range(4, 24),
            mask_prob=mask_prob,
            mask_token_prob=mask_token_prob,
            random_token_prob=mask_random_prob,
        )

        self.tokenizer = tokenizer

    def __len__(self):
        return len(self.clusters)

    def __getitem__(self, index):
        rng = np.random.default_rng([self.seed, index.epoch, index.idx])
        if not len(self.clusters[index.idx]):
            raise ValueError(f"Cluster {index.idx} is empty.")

        sequence_id = rng.choice(self.clusters[index.idx])
        sequence = self.protein_dataset[sequence_id]

        tokenized_sequence = self._tokenize(sequence)
        cropped_sequence = _random_crop(tokenized_sequence, self.max_seq_length, rng)

        torch_seed = random_utils.get_seed_from_rng(rng)
        masked_sequence, labels, loss_mask = masking.apply_bert_pretraining_mask(
            tokenized_sequence=cropped_sequence,
            random_seed=torch_seed,
            mask_config=self.mask_config,
        )

        return {
            "text": masked_sequence,
            "types": torch.zeros_like(masked_sequence, dtype=torch.int64),
            "attention_mask": torch.ones_like(masked_sequence, dtype=torch.int64),
            "labels": labels,
            "loss_mask": loss_mask,
            "is_random": torch.zeros_like(masked_sequence, dtype=torch.int64),
        }

    def _tokenize(self, sequence):
        tensor = self.tokenizer.encode(sequence, add_special_tokens=True, return_tensors="pt")
        return tensor.flatten()


def create_train_dataset(
    cluster_file,
    db_path,
    total_samples,
    seed,
    max_seq_length=1024,
    mask_prob=0.15,
    mask_token_prob=0.8,
    mask_random_prob=0.1,
    random_mask_strategy=RandomMaskStrategy.ALL_TOKENS,
    tokenizer=None,
):
    if not Path(cluster_file).exists():
        raise ValueError(f"Cluster file {cluster_file} not found.")

    if not Path(db_path).exists():
        raise ValueError(f"Database file {db_path} not found.")

    cluster_df = pd.read_parquet(cluster_file)
    if "ur90_id" not in cluster_df.columns:
        raise ValueError(
            f"Training cluster file must contain a 'ur90_id' column. Found columns {cluster_df.columns}."
        )

    protein_dataset = ProteinSQLiteDataset(db_path)
    masked_cluster_dataset = ESMMaskedResidueDataset(
        protein_dataset=protein_dataset,
        clusters=cluster_df["ur90_id"],
        seed=seed,
        max_seq_length=max_seq_length,
        mask_prob=mask_prob,
        mask_token_prob=mask_token_prob,
        mask_random_prob=mask_random_prob,
        random_mask_strategy=random_mask_strategy,
        tokenizer=tokenizer,
    )

    return MultiEpochDatasetResampler(
        masked_cluster_dataset, num_samples=total_samples, shuffle=True, seed=seed
    )


def _random_crop(s, crop_length, rng):
    if crop_length >= len(s):
        return s

    start_index = rng.integers(0, len(s) - crop_length)
    return s[start_index : start_index + crop_length]
