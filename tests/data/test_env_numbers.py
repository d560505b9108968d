"""Every numeric ``EPOCHAL_*`` environment variable goes through one checked parser.

A value outside the variable's range or not a whole number is an error naming the
variable, the value and the range; never a raw ``OverflowError`` from deep inside a
reader, never a silent fall back to the default.
"""

from __future__ import annotations

import pytest

from epochal.data.proteins.readers import read_fasta, read_proteins
from epochal.data.proteins.sequences import ProteinInputError, max_protein_length
from epochal.formats.bounded_parse import ConfigFileError, max_config_bytes
from epochal.formats.checked_config import ConfigFieldError, max_positions
from epochal.parallel import watchdog

#: variable -> (reader, the error its layer raises, its default)
READERS = {
    "EPOCHAL_MAX_PROTEIN_LENGTH": (max_protein_length, ProteinInputError, 1_000_000),
    "EPOCHAL_MAX_CONFIG_BYTES": (max_config_bytes, ConfigFileError, 8 * 1024 * 1024),
    "EPOCHAL_MAX_POSITIONS": (max_positions, ConfigFieldError, 1 << 24),
}
BAD = [
    "0",
    "-1",
    "-0x10",
    "nan",
    "NaN",
    "inf",
    "1.5",
    "1e6",
    "0x10",
    "ten",
    "1__0",
    "\u0663",  # an Arabic-Indic digit: int() takes it, the parser does not
    str(2**63),  # what the tester gave EPOCHAL_MAX_PROTEIN_LENGTH
    "9" * 5000,  # beyond int()'s digit limit
]


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("value", BAD, ids=lambda v: v if len(v) < 24 else f"{len(v)}-digits")
def test_a_bad_value_is_refused_naming_variable_value_and_range(monkeypatch, name, value):
    reader, error, default = READERS[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(error) as caught:
        reader()
    message = str(caught.value)
    assert f"environment variable {name}=" in message
    assert repr(value[:40]) in message  # the value given (cut when long)
    assert "an integer from 1 to " in message and f"default {default:,}" in message


@pytest.mark.parametrize("name", sorted(READERS))
def test_good_values_and_unset(monkeypatch, name):
    reader, _, default = READERS[name]
    monkeypatch.delenv(name, raising=False)
    assert reader() == default
    for raw, value in (("", default), ("  ", default), ("123", 123), (" 2_000 ", 2000), ("+7", 7)):
        monkeypatch.setenv(name, raw)
        assert reader() == value, raw


def test_the_largest_protein_length_reads_fasta_and_tables(tmp_path, monkeypatch):
    """At the top of its range the readers work (their line and cell limits fit)."""
    (tmp_path / "p.fasta").write_text(">a\nMKT\n")
    (tmp_path / "p.csv").write_text("id,sequence\na,MKV\n")
    monkeypatch.setenv("EPOCHAL_MAX_PROTEIN_LENGTH", str(2**31 - 1))
    assert [r[1] for r in read_fasta(tmp_path / "p.fasta")] == ["MKT"]
    assert [r[1] for r in read_proteins(tmp_path / "p.csv")] == ["MKV"]
    monkeypatch.setenv("EPOCHAL_MAX_PROTEIN_LENGTH", str(2**63))  # was: OverflowError
    with pytest.raises(ProteinInputError, match=r"EPOCHAL_MAX_PROTEIN_LENGTH='9223372036854775808' is out of range"):  # fmt: skip
        list(read_fasta(tmp_path / "p.fasta"))


def test_the_launcher_pid_is_checked_too(monkeypatch):
    monkeypatch.setenv(watchdog.LAUNCHER_PID_ENV, "12ab")
    with pytest.raises(ValueError, match="EPOCHAL_LAUNCHER_PID='12ab' is not a whole number"):
        watchdog._launcher_pid()
    monkeypatch.setenv(watchdog.LAUNCHER_PID_ENV, "4321")
    assert watchdog._launcher_pid() == 4321
    monkeypatch.delenv(watchdog.LAUNCHER_PID_ENV)
    assert watchdog._launcher_pid() is None
