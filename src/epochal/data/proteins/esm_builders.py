"""Build ESM-2 training and validation datasets from BioNeMo's files (BioNeMo's names and arguments).

:func:`create_train_dataset`, :func:`create_valid_clusters` and
:func:`create_valid_dataset` follow bionemo-esm2's functions of the same names
(``esm2/data/dataset.py`` at ``bf10c4d7``): an
:class:`~epochal.data.proteins.esm_dataset.ESMMaskedResidueDataset` over the
clusters, wrapped in :class:`~epochal.data.epochs.multi_epoch.MultiEpochDatasetResampler`
(``shuffle=True``, the same ``seed``). BioNeMo's ``train_esm2`` passes
``total_samples = max_steps * global_batch_size``. The samples per ``EpochIndex``
are BioNeMo's; the order of ``EpochIndex`` values is our resampler's (a per-epoch
permutation keyed by ``(seed, epoch)``, see its docstring), not BioNeMo's table of
epoch seeds.

:func:`build_esm_datasets` is the one call a trainer needs: paths and options in,
``(train, valid)`` out, with the cluster files checked against the database.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from epochal.data.epochs.multi_epoch import MultiEpochDatasetResampler
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.data.proteins.database import ProteinSQLiteDataset
from epochal.data.proteins.esm_dataset import ESMMaskedResidueDataset, RandomMaskStrategy
from epochal.data.proteins.layout import (
    check_cluster_members,
    read_train_clusters,
    read_valid_clusters,
)
from epochal.data.proteins.sequences import ProteinInputError

__all__ = [
    "build_esm_datasets",
    "create_train_dataset",
    "create_valid_clusters",
    "create_valid_dataset",
]


def _database(db_path: str | os.PathLike) -> ProteinSQLiteDataset:
    if not Path(db_path).exists():
        raise ProteinInputError(f"Database file {db_path} not found.")
    return ProteinSQLiteDataset(db_path)


def _resampled(
    clusters: Any, db_path: str | os.PathLike, total_samples: int | None, **options: Any
) -> MultiEpochDatasetResampler:
    """BioNeMo's wrapping: the clusters' samples, shuffled per epoch with the dataset's seed."""
    dataset = ESMMaskedResidueDataset(_database(db_path), clusters, **options)
    return MultiEpochDatasetResampler(
        dataset, num_samples=total_samples, shuffle=True, seed=options["seed"]
    )


def create_train_dataset(
    cluster_file: str | os.PathLike,
    db_path: str | os.PathLike,
    total_samples: int,
    seed: int,
    max_seq_length: int = 1024,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    mask_random_prob: float = 0.1,
    random_mask_strategy: RandomMaskStrategy | str = RandomMaskStrategy.ALL_TOKENS,
    tokenizer: ESM2Tokenizer | None = None,
) -> MultiEpochDatasetResampler:
    """The ESM-2 training set: ``total_samples`` samples over the clusters of ``cluster_file``.

    Args:
        cluster_file: parquet with a ``ur90_id`` column (a list of UniRef90 ids per row).
        db_path: the SQLite protein database.
        total_samples: samples served (``max_steps * global_batch_size``).
        seed: seeds the samples and the per-epoch shuffles.
        max_seq_length ... tokenizer: see :class:`ESMMaskedResidueDataset`.

    Returns:
        ``MultiEpochDatasetResampler`` of ``total_samples`` samples, shuffled every epoch.

    Raises:
        ProteinInputError: a file is missing or unreadable, no ``ur90_id`` column, an
            empty cluster (a ``ValueError``, as BioNeMo's).
    """
    clusters = read_train_clusters(cluster_file)
    options = dict(locals())
    del options["cluster_file"], options["clusters"], options["db_path"], options["total_samples"]
    return _resampled(clusters, db_path, total_samples, **options)


def create_valid_clusters(cluster_file: str | os.PathLike) -> Any:
    """The validation clusters of a ``ur50_id`` parquet: a pandas Series of one-id lists.

    Raises:
        ProteinInputError: missing/unreadable file, no ``ur50_id`` column, an empty id.
    """
    return read_valid_clusters(cluster_file)


def create_valid_dataset(
    clusters: Any,
    db_path: str | os.PathLike,
    seed: int,
    total_samples: int | None = None,
    max_seq_length: int = 1024,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    mask_random_prob: float = 0.1,
    random_mask_strategy: RandomMaskStrategy | str = RandomMaskStrategy.ALL_TOKENS,
    tokenizer: ESM2Tokenizer | None = None,
) -> MultiEpochDatasetResampler:
    """The ESM-2 validation set (one protein per cluster, masked per epoch).

    Args:
        clusters: a pandas Series of one-id lists (:func:`create_valid_clusters`) or
            the path of a ``ur50_id`` parquet.
        db_path: the SQLite protein database.
        seed: seeds the samples and the shuffle.
        total_samples: samples served; None: one epoch.
        max_seq_length ... tokenizer: see :class:`ESMMaskedResidueDataset`.

    Raises:
        ProteinInputError: bad cluster file or missing database.
        ValueError: ``clusters`` is neither a path nor a pandas Series.
    """
    import pandas as pd

    if isinstance(clusters, str | os.PathLike):
        clusters = create_valid_clusters(clusters)
    elif not isinstance(clusters, pd.Series):
        raise ValueError(f"Clusters must be a pandas Series. Got {type(clusters)}.")
    options = dict(locals())
    del options["clusters"], options["db_path"], options["total_samples"], options["pd"]
    return _resampled(clusters, db_path, total_samples, **options)


def build_esm_datasets(
    train_cluster_path: str | os.PathLike,
    train_database_path: str | os.PathLike,
    *,
    train_samples: int,
    seed: int,
    valid_cluster_path: str | os.PathLike | None = None,
    valid_database_path: str | os.PathLike | None = None,
    valid_samples: int | None = None,
    max_seq_length: int = 1024,
    mask_prob: float = 0.15,
    mask_token_prob: float = 0.8,
    mask_random_prob: float = 0.1,
    random_mask_strategy: RandomMaskStrategy | str = RandomMaskStrategy.ALL_TOKENS,
    tokenizer: ESM2Tokenizer | None = None,
    check_members: bool = True,
) -> tuple[MultiEpochDatasetResampler, MultiEpochDatasetResampler | None]:
    """The train and validation sets of an ESM-2 run, from BioNeMo-layout paths.

    For FASTA/CSV/TSV/parquet inputs, convert first with
    :func:`~epochal.data.proteins.layout.proteins_to_bionemo_layout` and pass its paths.

    Args:
        train_cluster_path / train_database_path: the ``ur90_id`` parquet and its database.
        train_samples: training samples (``max_steps * global_batch_size``).
        seed: the run's data seed (train and validation sets both use it, as BioNeMo).
        valid_cluster_path: the ``ur50_id`` parquet; None: no validation set.
        valid_database_path: its database (default: the training database).
        valid_samples: validation samples; None: one pass over the validation clusters.
        max_seq_length ... tokenizer: see :class:`ESMMaskedResidueDataset`.
        check_members: look every cluster member up in its database first (one
            indexed query per 900 ids), so that a bad file fails now, named.

    Returns:
        ``(train, valid)``; ``valid`` is None without ``valid_cluster_path``.

    Raises:
        ProteinInputError: a missing/unreadable file, a missing column, an empty
            cluster, members missing from the database (with ``check_members``).
    """
    options = dict(
        max_seq_length=max_seq_length,
        mask_prob=mask_prob,
        mask_token_prob=mask_token_prob,
        mask_random_prob=mask_random_prob,
        random_mask_strategy=random_mask_strategy,
        tokenizer=tokenizer,
    )
    train = create_train_dataset(
        train_cluster_path, train_database_path, train_samples, seed, **options
    )
    if check_members:
        check_cluster_members(train.dataset.clusters, train_database_path, str(train_cluster_path))
    if valid_cluster_path is None:
        return train, None
    valid_db = train_database_path if valid_database_path is None else valid_database_path
    clusters = create_valid_clusters(valid_cluster_path)
    if check_members:
        check_cluster_members(clusters, valid_db, str(valid_cluster_path))
    valid = create_valid_dataset(clusters, valid_db, seed, valid_samples, **options)
    return train, valid
