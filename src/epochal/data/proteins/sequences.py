"""What a protein sequence may contain, and how its text is normalised before tokenizing.

The rules every protein reader of :mod:`epochal.data.proteins` applies (FASTA,
CSV/TSV/parquet, the aaanalysis benchmarks); the resulting text is what is stored
in the SQLite database and what :class:`~epochal.data.proteins.esm_dataset.ESMMaskedResidueDataset`
tokenizes:

- whitespace (FASTA line breaks, spaces in a table cell) is removed;
- lower-case letters are upper-cased (``mkta`` -> ``MKTA``; ESM-2's tokenizer
  would otherwise read a lower-case run as one ``<unk>``);
- one ``*`` at the very end (a stop codon from a translation) is stripped; a ``*``
  anywhere else is refused;
- the 20 standard amino acids and ``X`` (unknown), ``B`` (D or N), ``Z`` (E or Q),
  ``U`` (selenocysteine) and ``O`` (pyrrolysine) are kept: each is its own ESM-2
  token (ids 24-28 for the last five);
- anything else is refused with :class:`ProteinInputError` naming the characters:
  alignment gaps ``-`` and ``.`` (ESM-2 tokens, but not residues: unalign first),
  ``J`` (not in ESM-2's alphabet: write ``X``), digits, ``<`` (no special tokens
  in input files), ...;
- a sequence left empty is refused.

Databases in BioNeMo's layout are read as they are (BioNeMo does not check them);
:func:`check_sequence` can be applied to them explicitly.
"""

from __future__ import annotations

import re

__all__ = [
    "PROTEIN_RESIDUES",
    "ProteinInputError",
    "check_sequence",
    "clean_sequence",
]

#: the one-letter residues an input sequence may hold (each an ESM-2 token).
PROTEIN_RESIDUES = "ACDEFGHIKLMNPQRSTVWY" + "XBZUO"

_WHITESPACE = re.compile(r"\s+")
_BAD = re.compile(f"[^{PROTEIN_RESIDUES}]")


class ProteinInputError(ValueError):
    """A protein input file or database is malformed (the message names file and record)."""


def _bad_characters(sequence: str) -> str:
    found = sorted(set(_BAD.findall(sequence)))
    return ", ".join(repr(c) for c in found)


def check_sequence(sequence: str, where: str) -> None:
    """Refuse a stored sequence that is empty or holds characters outside :data:`PROTEIN_RESIDUES`.

    Args:
        sequence: the sequence as stored (already normalised).
        where: the record's location for the message, e.g. ``"db.sqlite: id 'P1'"``.

    Raises:
        ProteinInputError: empty, or the characters outside the alphabet are listed.
    """
    if not sequence:
        raise ProteinInputError(f"{where}: empty sequence")
    if _BAD.search(sequence):
        raise ProteinInputError(
            f"{where}: characters outside the protein alphabet: {_bad_characters(sequence)} "
            f"(allowed: {PROTEIN_RESIDUES}, lower case, a final '*')"
        )


def clean_sequence(text: str, where: str) -> str:
    """Normalise one protein's text by the module's rules and check it.

    Args:
        text: the raw sequence (any case, may hold whitespace and a final ``*``).
        where: the record's location for error messages, e.g. ``"a.fasta:12 (>P1)"``.

    Returns:
        The upper-case sequence of residues, without whitespace or final ``*``.

    Raises:
        ProteinInputError: the sequence is empty, or holds characters outside the
            alphabet (listed in the message; ``-``/``.``, ``J``, digits, inner ``*``).
    """
    sequence = _WHITESPACE.sub("", text).upper()
    if sequence.endswith("*"):
        sequence = sequence[:-1]
    check_sequence(sequence, where)
    return sequence
