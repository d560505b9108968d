"""Small files of real proteins that ship with epochal, for first runs and the documentation.

- ``proteins.fasta``: 300 proteins of 50-250 residues (150 soluble, 150 insoluble when
  expressed in *E. coli*), to pretrain on.
- ``solubility.csv``: 200 other proteins of the same source, columns ``id``,
  ``sequence``, ``label`` (``soluble`` / ``insoluble``): a sequence-level task.
- ``disorder.csv``: 80 proteins of 50-300 residues, columns ``id``, ``sequence``,
  ``disorder``: a character per residue, ``D`` (in a long disordered region) or ``O``
  (ordered): a residue-level task.

They are subsets of the benchmark tables of the ``aaanalysis`` package (BSD-3-Clause):
``SEQ_SOLUBLE`` (SOLpro's data, Magnan et al., 2009) and ``AA_LDR`` (IDP-Seq2Seq's,
Tang et al., 2020). ``SOURCES.md`` beside this file says how they were selected and
carries aaanalysis' license. Copy them into a folder with
``python -m epochal.data.proteins.examples [FOLDER]``.
"""

from __future__ import annotations

import filecmp
import os
import shutil
from pathlib import Path

__all__ = ["EXAMPLE_FILES", "copy_examples", "example_path"]

#: The files this package ships, in the order :func:`copy_examples` writes them.
EXAMPLE_FILES = ("proteins.fasta", "solubility.csv", "disorder.csv")
_HERE = Path(__file__).resolve().parent


def example_path(name: str) -> Path:
    """The path of one shipped file.

    Raises:
        ValueError: ``name`` is not one of :data:`EXAMPLE_FILES` (lists them).
    """
    if name not in EXAMPLE_FILES:
        raise ValueError(f"no example file {name!r}; there are {', '.join(EXAMPLE_FILES)}")
    return _HERE / name


def copy_examples(folder: str | os.PathLike = ".") -> list[Path]:
    """Copy every shipped file into ``folder`` (created if needed); return the copies' paths.

    A file already there with the same content is left as it is.

    Raises:
        FileExistsError: a file of the same name with other content is in ``folder``
            (nothing is overwritten; names the file).
    """
    dest = Path(folder)
    targets = [dest / name for name in EXAMPLE_FILES]
    for name, target in zip(EXAMPLE_FILES, targets):
        if target.exists() and not filecmp.cmp(example_path(name), target, shallow=False):
            raise FileExistsError(f"{target} exists with other content; not overwritten")
    dest.mkdir(parents=True, exist_ok=True)
    for name, target in zip(EXAMPLE_FILES, targets):
        if not target.exists():
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            shutil.copyfile(example_path(name), tmp)
            os.replace(tmp, target)
    return targets
