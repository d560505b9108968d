"""What a protein sequence may contain, how its text is normalised, and how long it may be.

The rules every protein reader applies (FASTA, CSV/TSV/parquet tables for
pretraining, fine-tuning tables of :mod:`epochal.data.datasets.labelled`, the input
of ``epochal embed``, the aaanalysis benchmarks); the resulting text is what is
stored in the SQLite database and what the models tokenize, one token per residue:

- whitespace (FASTA line breaks, spaces in a table cell) is removed;
- ASCII lower-case letters are upper-cased (``mkta`` -> ``MKTA``; ESM-2's tokenizer
  would otherwise read a lower-case run as one ``<unk>``);
- one ``*`` at the very end (a stop codon from a translation) is stripped; a ``*``
  anywhere else is refused;
- the 20 standard amino acids and ``X`` (unknown), ``B`` (D or N), ``Z`` (E or Q),
  ``U`` (selenocysteine) and ``O`` (pyrrolysine) are kept: each is its own ESM-2
  token (ids 24-28 for the last five);
- anything else is refused with :class:`ProteinInputError` naming the record and the
  characters: alignment gaps ``-`` and ``.`` (ESM-2 tokens, but not residues:
  unalign first), ``J`` (not in ESM-2's alphabet: write ``X``), digits, ``<`` (no
  special tokens in input files), control characters such as NUL, and every
  non-ASCII character (Unicode case mapping would turn ``ß`` into ``SS``, ``ı`` into
  ``I``, ``ﬁ`` into ``FI``: none of them is a residue);
- a sequence left empty is refused;
- a sequence longer than :func:`max_protein_length` characters (1,000,000 by default,
  the ``EPOCHAL_MAX_PROTEIN_LENGTH`` environment variable overrides it) is refused:
  the bound on the memory a reader may use for one record.

Databases in BioNeMo's layout hold sequences already normalised: they are checked
(:func:`check_sequence`), never rewritten.
"""

from __future__ import annotations

import re

from epochal._env import env_int

__all__ = [
    "DEFAULT_MAX_PROTEIN_LENGTH",
    "ENV_MAX_PROTEIN_LENGTH",
    "PROTEIN_RESIDUES",
    "ProteinInputError",
    "check_sequence",
    "clean_sequence",
    "is_clean",
    "max_protein_length",
    "only_characters",
    "too_long",
]

#: the one-letter residues an input sequence may hold (each an ESM-2 token).
PROTEIN_RESIDUES = "ACDEFGHIKLMNPQRSTVWY" + "XBZUO"
#: the longest protein a reader accepts by default, in characters.
DEFAULT_MAX_PROTEIN_LENGTH = 1_000_000
#: the environment variable that overrides :data:`DEFAULT_MAX_PROTEIN_LENGTH`.
ENV_MAX_PROTEIN_LENGTH = "EPOCHAL_MAX_PROTEIN_LENGTH"
#: the largest value it accepts: a line of that many characters, and a table row of one
#: such cell per column, still fit the readers' machine-sized line and cell limits.
MAX_PROTEIN_LENGTH_LIMIT = 2**31 - 1

_SPACES = " \t\n\r\f\v"
_WHITESPACE = re.compile(f"[{_SPACES}]+")
_RESIDUE_BYTES = PROTEIN_RESIDUES.encode("ascii")
_BAD = re.compile(f"[^{PROTEIN_RESIDUES}]")


class ProteinInputError(ValueError):
    """A protein input file or database is malformed (the message names file and record)."""


def max_protein_length() -> int:
    """The longest sequence (and FASTA line, table cell) a reader accepts, in characters.

    ``$EPOCHAL_MAX_PROTEIN_LENGTH`` when set, else :data:`DEFAULT_MAX_PROTEIN_LENGTH`.

    Raises:
        ProteinInputError: the variable is set but not an integer from 1 to
            :data:`MAX_PROTEIN_LENGTH_LIMIT` (the message names it and the range).
    """
    return env_int(
        ENV_MAX_PROTEIN_LENGTH,
        DEFAULT_MAX_PROTEIN_LENGTH,
        minimum=1,
        maximum=MAX_PROTEIN_LENGTH_LIMIT,
        unit="characters",
        error=ProteinInputError,
    )


def too_long(where: str, what: str, limit: int) -> str:
    """The message for ``what`` at ``where`` being over ``limit`` characters (names the override).

    ``what`` may say how ``limit`` derives from the protein length limit (a table row).
    """
    return (
        f"{where}: {what} longer than {limit:,} characters (the limit on a protein's length; "
        f"set {ENV_MAX_PROTEIN_LENGTH} to a larger number of characters to accept it)"
    )


def only_characters(text: str, allowed: bytes) -> bool:
    """Whether ``text`` is ASCII made only of the characters ``allowed`` (one pass in C).

    Checked 64 KiB at a time, so a long protein is never copied whole.
    """
    if not text.isascii():
        return False
    step = 1 << 16
    return not any(
        text[i : i + step].encode("ascii").translate(None, allowed)
        for i in range(0, len(text), step)
    )


def _outside_alphabet(ascii_text: str) -> bool:
    """Whether an ASCII text holds anything but :data:`PROTEIN_RESIDUES`."""
    return not only_characters(ascii_text, _RESIDUE_BYTES)


def is_clean(text: str) -> bool:
    """Whether ``text`` is already a clean sequence's text: only :data:`PROTEIN_RESIDUES`.

    (Empty text qualifies; :func:`clean_sequence` still refuses it.) Readers use it to
    keep long proteins without copying them.
    """
    return text.isascii() and not _outside_alphabet(text)


def _shown(characters: set[str]) -> str:
    return ", ".join(repr(c) for c in sorted(characters))


#: what an input file's sequence may hold, for messages.
INPUT_RULE = f"allowed: {PROTEIN_RESIDUES}, lower case, a final '*'"


def check_sequence(
    sequence: str, where: str, error: type[ValueError] = ProteinInputError, rule: str = INPUT_RULE
) -> None:
    """Refuse a stored sequence that is empty or holds characters outside :data:`PROTEIN_RESIDUES`.

    Args:
        sequence: the sequence as stored (already normalised).
        where: the record's location for the message, e.g. ``"db.sqlite: id 'P1'"``.
        error: the exception class raised (a reader's own).
        rule: what is allowed, in parentheses after the characters.

    Raises:
        ProteinInputError: empty, or the characters outside the alphabet are listed.
    """
    if not sequence:
        raise error(f"{where}: empty sequence")
    if not sequence.isascii() or _outside_alphabet(sequence):
        raise error(
            f"{where}: characters outside the protein alphabet: "
            f"{_shown(set(_BAD.findall(sequence)))} ({rule})"
        )


def clean_sequence(
    text: str,
    where: str,
    *,
    error: type[ValueError] = ProteinInputError,
    max_length: int | None = None,
) -> str:
    """Normalise one protein's text by the module's rules and check it.

    Args:
        text: the raw sequence (any case, may hold whitespace and a final ``*``).
        where: the record's location for error messages, e.g. ``"a.fasta:12 (>P1)"``.
        error: the exception class raised (a reader's own; default :class:`ProteinInputError`).
        max_length: the longest accepted sequence (default :func:`max_protein_length`).

    Returns:
        The upper-case sequence of residues, without whitespace or final ``*``.

    Raises:
        ProteinInputError: the sequence is empty, too long, or holds characters outside
            the alphabet (listed in the message; ``-``/``.``, ``J``, digits, inner
            ``*``, non-ASCII characters).
    """
    if not text.isascii():
        odd = {c for c in text if not c.isascii()}
        raise error(
            f"{where}: non-ASCII characters {_shown(odd)} (protein sequences hold the letters "
            f"{PROTEIN_RESIDUES}, in either case)"
        )
    # Fast path for the usual text (upper-case residues, maybe whitespace): one C pass
    # and no copy of a long protein; lower case, '*' and refusals take the general path.
    sequence = text
    if any(c in text for c in _SPACES):
        sequence = _WHITESPACE.sub("", text)
    checked = not _outside_alphabet(sequence)
    if not checked:
        sequence = sequence.upper()
        if sequence.endswith("*"):
            sequence = sequence[:-1]
    limit = max_protein_length() if max_length is None else max_length
    if len(sequence) > limit:
        raise error(too_long(where, f"a sequence of {len(sequence):,} residues", limit))
    if not checked or not sequence:
        check_sequence(sequence, where, error)
    return sequence
