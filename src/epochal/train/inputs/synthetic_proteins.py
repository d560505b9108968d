"""Synthetic protein families for the ESM demo and tests (``data.mock = true`` with ``model.type = "esm"``).

No network and no package data: a fixed generator writes ``proteins.fasta`` and an
MMseqs2-style ``clusters.tsv`` (``representative<TAB>member``) once into
``<cache_dir>/proteins-synthetic-v1/``. The proteins are learnable, so a tiny model's
loss falls: every family's representative is a walk of a first-order Markov chain
over the 20 standard amino acids in which each residue has four likely successors;
its 1-4 members are copies with about 8% of the residues substituted. Lengths are
40-200 residues (longer ones get cropped at ``seq_length = 128``). Everything is a
function of :data:`SEED` and the counts, the same on every machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from epochal.train.inputs.cache_temporaries import cache_temporary

__all__ = ["SEED", "synthetic_families", "write_synthetic_proteins"]

#: seeds the generator (a constant: the demo data is the same everywhere).
SEED = 20240917
AMINO_ACIDS = "LAGVSERTIDPKQNFYMHWC"  # the 20 standard residues
_VERSION = 1


def synthetic_families(num_families: int = 160, seed: int = SEED) -> list[list[tuple[str, str]]]:
    """``num_families`` families of ``(id, sequence)``; the first member is the representative.

    Raises:
        ValueError: ``num_families < 1``.
    """
    if num_families < 1:
        raise ValueError(f"num_families must be >= 1, got {num_families}")
    rng = np.random.default_rng(seed)
    n = len(AMINO_ACIDS)
    successors = np.stack([rng.permutation(n)[:4] for _ in range(n)])  # [20, 4]
    families = []
    for f in range(num_families):
        length = int(rng.integers(40, 201))
        walk = np.empty(length, dtype=np.int64)
        walk[0] = rng.integers(n)
        likely = rng.random(length) < 0.9
        pick, anyone = rng.integers(0, 4, length), rng.integers(0, n, length)
        for i in range(1, length):
            walk[i] = successors[walk[i - 1], pick[i]] if likely[i] else anyone[i]
        members = []
        for m in range(int(rng.integers(1, 5))):
            residues = walk.copy()
            if m:
                changed = rng.random(length) < 0.08
                residues[changed] = rng.integers(0, n, int(changed.sum()))
            members.append((f"fam{f:04d}_{m}", "".join(AMINO_ACIDS[r] for r in residues)))
        families.append(members)
    return families


def write_synthetic_proteins(cache_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Write (once) the synthetic FASTA and cluster TSV under ``cache_dir``.

    Returns:
        ``(fasta, clusters_tsv)`` paths. The folder is written under a temporary
        name and renamed, so concurrent ranks and interrupted runs never see half a file.
    """
    folder = Path(cache_dir) / f"proteins-synthetic-v{_VERSION}"
    fasta, clusters = folder / "proteins.fasta", folder / "clusters.tsv"
    if fasta.is_file() and clusters.is_file():
        return fasta, clusters
    tmp = cache_temporary(folder, "proteins-")
    tmp.mkdir()
    try:
        families = synthetic_families()
        with open(tmp / "proteins.fasta", "w") as out:
            for family in families:
                for pid, seq in family:
                    out.write(f">{pid} synthetic family member\n")
                    out.writelines(seq[i : i + 60] + "\n" for i in range(0, len(seq), 60))
        with open(tmp / "clusters.tsv", "w") as out:
            for family in families:
                out.writelines(f"{family[0][0]}\t{pid}\n" for pid, _ in family)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not (fasta.is_file() and clusters.is_file()):  # not a concurrent winner
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return fasta, clusters
