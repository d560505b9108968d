"""ESM-2 pretraining data for the trainer: BioNeMo's samples from protein files, from ``config.data``.

One protein source (:class:`~epochal.train.config.DataConfig` documents the keys):

- BioNeMo's layout: ``data.train_cluster_path`` + ``data.train_database_path``
  (``ur90_id`` clusters + SQLite), optionally ``data.valid_cluster_path`` (+
  ``data.valid_database_path``), as ``train_esm2``'s flags;
- ``data.protein_path``: a FASTA / CSV / TSV / parquet file (with
  ``data.protein_clusters``, an MMseqs2 TSV), converted once into that layout under
  ``<cache_dir>/proteins-<key>/`` (:func:`epochal.data.proteins_to_bionemo_layout`;
  the key hashes the files' paths, sizes and modification times and the split
  options) and split into train / validation clusters by ``data.protein_valid_fraction``
  (a permutation seeded by ``training.seed``);
- ``data.mock``: the synthetic protein families of
  :mod:`epochal.train.inputs.synthetic_proteins`, through the same FASTA path.

Samples are :class:`epochal.data.ESMMaskedResidueDataset`'s (member drawn, cropped to
``data.seq_length`` and masked per ``EpochIndex``, BioNeMo's semantics) under
:class:`~epochal.data.MultiEpochDatasetResampler` with BioNeMo's sizes: ``train_iters *
global_batch_size`` training samples and ``eval_iters * global_batch_size`` validation
samples (every evaluation reads the validation data from its start). The global order
does not depend on the data-parallel size, so a resume on another size continues it.

:class:`PaddedProteinSamples` pads every sample to ``data.seq_length`` for
:class:`~epochal.train.steps.BertTrainStep` (``tokens`` (the masked ids), ``labels`` (-100 where not
predicted), ``loss_mask``, ``padding_mask`` (1 = residue or special token)) and answers
the per-epoch evidence questions (:mod:`epochal.train.inputs.epoch_evidence`): which
cluster a sample is, which earlier samples were the same cluster, which member it drew.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.data.proteins.esm_builders import build_esm_datasets
from epochal.data.proteins.layout import proteins_to_bionemo_layout
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig
from epochal.train.inputs.cache_temporaries import cache_temporary
from epochal.train.inputs.corpus import default_cache_dir, tokenizer_from_config
from epochal.train.inputs.synthetic_proteins import write_synthetic_proteins

__all__ = ["PaddedProteinSamples", "build_esm_train_datasets", "prepare_protein_layout"]

_LAYOUT_VERSION = 1
_SCAN_CHUNK = 1 << 20


class PaddedProteinSamples(torch.utils.data.Dataset):
    """Pads resampled ESM samples to ``seq_length`` and exposes their epochs and clusters.

    Args:
        resampler: a :class:`~epochal.data.MultiEpochDatasetResampler` over an
            :class:`~epochal.data.ESMMaskedResidueDataset`.
        seq_length: tokens per padded sample (>= the dataset's ``max_seq_length``).
        pad_id: the padding token's id (ESM-2: 1).

    Items (BioNeMo's ``MaskedTokenDataset`` keys, which the pipeline-parallel engine reads):
    ``tokens``/``labels`` int64 ``[seq_length]`` (labels -100 where not predicted),
    ``loss_mask`` float32 ``[seq_length]``, ``padding_mask`` int64 ``[seq_length]``.
    """

    evidence_unit = "cluster"

    def __init__(self, resampler: Any, seq_length: int, pad_id: int) -> None:
        self.resampler = resampler
        self.seq_length = int(seq_length)
        self.pad_id = int(pad_id)

    def __len__(self) -> int:
        return len(self.resampler)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        sample = self.resampler[index]
        n = sample["text"].shape[0]
        if n > self.seq_length:
            raise ValueError(
                f"sample {index} has {n} tokens, more than seq_length={self.seq_length}"
            )
        pad = self.seq_length - n
        padding = torch.zeros(self.seq_length, dtype=torch.int64)
        padding[:n] = 1
        return {
            "tokens": torch.nn.functional.pad(sample["text"], (0, pad), value=self.pad_id),
            "labels": torch.nn.functional.pad(sample["labels"], (0, pad), value=-100),
            "loss_mask": torch.nn.functional.pad(sample["loss_mask"].float(), (0, pad)),
            "padding_mask": padding,
        }

    # -------------------------------------------------- per-epoch evidence
    @property
    def samples_per_epoch(self) -> int:
        """Samples in one pass over the clusters (the number of clusters)."""
        return len(self.resampler.dataset)

    def sample_span(self, index: int) -> tuple[int, int]:
        """``(cluster, cluster + 1)``: the cluster sample ``index`` is drawn from."""
        idx = self.resampler.epoch_index(index).idx
        return idx, idx + 1

    def earlier_occurrences(self, index: int, before: int) -> np.ndarray:
        """Indices ``< before`` of the samples of the same cluster as sample ``index`` (ascending).

        Scans the earlier epochs' orders in chunks (O(before); run once per epoch start).
        """
        cluster = self.resampler.epoch_index(index).idx
        stop = max(0, min(int(before), len(self)))
        found = []
        for start in range(0, stop, _SCAN_CHUNK):
            _, idx = self.resampler.epoch_indices(start, min(stop, start + _SCAN_CHUNK))
            found.append(np.flatnonzero(idx == cluster) + start)
        return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)

    def sample_member(self, index: int) -> tuple[str, int]:
        """``(member id, cluster size)`` of sample ``index``.

        (:meth:`~epochal.data.ESMMaskedResidueDataset.member`).
        """
        return self.resampler.dataset.member(self.resampler.epoch_index(index))

    # ------------------------------------------- sample identities (sample_identity)
    def sample_identity(self, index: int) -> dict[str, Any]:
        """``{"epoch": e, "cluster": c}`` of sample ``index`` (nothing drawn or read)."""
        return self.resampler.sample_identity(index)

    def sample_identities(self, start: int, stop: int) -> list[dict[str, Any]]:
        """:meth:`sample_identity` of samples ``start .. stop - 1``, epochs mapped at once."""
        return self.resampler.sample_identities(start, stop)

    def sample_details(self, index: int) -> dict[str, Any]:
        """``{"member": id}``: the member sample ``index`` draws from its cluster (for listings)."""
        return {"member": self.sample_member(index)[0]}


def _file_key(path: str) -> dict[str, Any]:
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(
            "data.protein_path", f"cannot read {path}: {exc.strerror or exc}"
        ) from None
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def prepare_protein_layout(
    protein_path: str | os.PathLike,
    cache: Path,
    *,
    clusters: str | os.PathLike | None,
    valid_fraction: float,
    seed: int,
    sequence_column: str = "sequence",
    id_column: str | None = None,
    log: Any = None,
) -> tuple[Path, Path, Path | None]:
    """Convert a protein file into BioNeMo's layout under ``cache`` (once; reused while unchanged).

    Returns:
        ``(database, train_clusters, valid_clusters or None)``.

    Raises:
        ProteinInputError: a bad record or cluster file (names file and line/row).
        ConfigError: a file that cannot be read (names ``data.protein_path``).
    """
    key = {
        "version": _LAYOUT_VERSION,
        "proteins": _file_key(str(protein_path)),
        "clusters": _file_key(str(clusters)) if clusters else None,
        "valid_fraction": valid_fraction,
        "seed": seed,
        "columns": [sequence_column, id_column],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = cache / f"proteins-{digest}"
    done = folder / "layout.json"
    if not done.is_file():
        if log:
            log(f"converting {protein_path} into BioNeMo's SQLite + parquet layout ...")
        tmp = cache_temporary(folder, "proteins-")
        try:
            layout = proteins_to_bionemo_layout(
                protein_path,
                tmp,
                clusters=clusters,
                valid_fraction=valid_fraction,
                seed=seed,
                sequence_column=sequence_column,
                id_column=id_column,
            )
            info = {**key, "proteins_stored": layout.num_proteins}
            info["train_clusters"] = layout.num_train_clusters
            info["valid_clusters"] = layout.num_valid_clusters
            (tmp / "layout.json").write_text(json.dumps(info, indent=1))
            try:
                os.replace(tmp, folder)
            except OSError:
                if not done.is_file():  # not a concurrent winner: a real error
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    valid = folder / "valid_clusters.parquet"
    return (
        folder / "proteins.sqlite",
        folder / "train_clusters.parquet",
        (valid if valid.is_file() else None),
    )


def _sources(config: TrainConfig, cache: Path, log: Any) -> tuple[str, str, Any, Any, str]:
    """``(train clusters, train db, valid clusters, valid db, description)`` of ``config.data``."""
    d = config.data
    if d.train_cluster_path:
        return (
            d.train_cluster_path,
            d.train_database_path,
            d.valid_cluster_path or None,
            d.valid_database_path or None,
            f"clusters {d.train_cluster_path} of {d.train_database_path}",
        )
    if d.protein_path:
        path, clusters, what = d.protein_path, d.protein_clusters or None, d.protein_path
    elif d.mock:
        fasta, tsv = write_synthetic_proteins(cache)
        path, clusters, what = str(fasta), str(tsv), "synthetic protein families"
    else:
        raise ConfigError(
            "data.protein_path",
            "model.type='esm' trains on proteins: set data.protein_path (FASTA/CSV/TSV/parquet), "
            "data.train_cluster_path + data.train_database_path (BioNeMo's layout) or data.mock",
        )
    db, train, valid = prepare_protein_layout(
        path,
        cache,
        clusters=clusters,
        valid_fraction=d.protein_valid_fraction,
        seed=config.training.seed,
        sequence_column=d.protein_sequence_column,
        id_column=d.protein_id_column or None,
        log=log,
    )
    return str(train), str(db), None if valid is None else str(valid), None, what


def build_esm_train_datasets(
    config: TrainConfig, *, log: Any = None, group: Any = None
) -> tuple[Any, Any | None, int, Any, str]:
    """Return ``(train, valid or None, vocab_size, tokenizer, description)`` for an ESM run.

    Args:
        config: the configuration (``[data]`` as in the module docstring).
        log: ``log(str)`` for progress messages (the conversion of a protein file).
        group: unused (every rank converts into the same cache folder, atomically).

    Raises:
        ConfigError: no protein source, a text source (``data.corpus``, ``data.data_path``
            ...), or ``data.tokenizer_type`` is not ESM-2's.
        ProteinInputError: a bad protein, cluster or database file (named).
    """
    del group
    d, t = config.data, config.training
    for name in ("corpus", "data_path", "train_data_path", "valid_data_path", "test_data_path"):
        if getattr(d, name):
            raise ConfigError(
                f"data.{name}",
                "is text / token data; model.type='esm' trains on proteins (data.protein_path, "
                "data.train_cluster_path + data.train_database_path, or data.mock)",
            )
    # unset: ESM-2's alphabet (the only tokenizer ESM trains with)
    tokenizer = tokenizer_from_config(d if d.tokenizer_type else replace(d, tokenizer_type="esm"))
    if not isinstance(tokenizer, ESM2Tokenizer):
        raise ConfigError(
            "data.tokenizer_type",
            f"must be 'ESM2Tokenizer' for model.type='esm', got {d.tokenizer_type!r}",
        )
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    train_clusters, train_db, valid_clusters, valid_db, what = _sources(config, cache, log)
    train_samples = t.train_iters * t.global_batch_size
    valid_samples = t.eval_iters * t.global_batch_size
    train, valid = build_esm_datasets(
        train_clusters,
        train_db,
        train_samples=train_samples,
        seed=t.seed,
        valid_cluster_path=valid_clusters,
        valid_database_path=valid_db,
        valid_samples=valid_samples if valid_samples else None,
        max_seq_length=d.seq_length,
        mask_prob=d.masking_probability,
        mask_token_prob=d.mask_token_prob,
        mask_random_prob=d.mask_random_prob,
        random_mask_strategy=d.random_mask_strategy,
        tokenizer=tokenizer,
    )
    pad = tokenizer.pad
    train = PaddedProteinSamples(train, d.seq_length, pad)
    valid = None if valid is None else PaddedProteinSamples(valid, d.seq_length, pad)
    clusters = train.samples_per_epoch
    description = (
        f"ESM-2 samples of {what} ({clusters:,} train clusters"
        + (f", {valid.samples_per_epoch:,} validation" if valid is not None else "")
        + f"); {train_samples:,} train samples ({train_samples / clusters:.2f} epochs)"
        + (f", {valid_samples:,} validation" if valid is not None else "")
        + f", up to {d.seq_length} tokens each, mask {d.masking_probability:g} "
        f"({d.mask_token_prob:g} <mask>, {d.mask_random_prob:g} random: {d.random_mask_strategy})"
    )
    return train, valid, tokenizer.vocab_size, tokenizer, description
