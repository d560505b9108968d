"""Memory of reading long proteins: refused or processed within a stated bound, measured as the
peak RSS of a child process (finding 14 of the input hardening).

The bound: a protein file is read line by line and a record is refused once it holds more
than ``EPOCHAL_MAX_PROTEIN_LENGTH`` characters (1,000,000 by default), so a 64 MB
single-protein FASTA, a 1 MB gzip expanding to a 1 GiB line, and ``/dev/zero`` stop after
about a megabyte; an accepted protein of ``n`` residues costs at most 3 bytes per residue to
read (its lines, then the joined sequence), and a training sample is cut from the text before
tokenizing (32 tokens, whatever ``n``).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import epochal

ENV_MAX_PROTEIN_LENGTH = "EPOCHAL_MAX_PROTEIN_LENGTH"  # the documented override


ROOT = Path(__file__).resolve().parents[2]
LINE = ("MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ" * 2)[:60] + "\n"


def _child(kind: str, path: Path, *extra: str, limit: int | None = None) -> dict:
    env = dict(os.environ)
    src = Path(epochal.__file__).resolve().parents[1]  # the epochal under test
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT), env.get("PYTHONPATH", "")])
    env.pop(ENV_MAX_PROTEIN_LENGTH, None)
    if limit is not None:
        env[ENV_MAX_PROTEIN_LENGTH] = str(limit)
    done = subprocess.run(
        [sys.executable, "-m", "tests.data.memory_child", kind, str(path), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fasta(path: Path, residues: int, one_line: bool = False) -> Path:
    with open(path, "w") as f:
        f.write(">giant a single long protein\n")
        if one_line:
            f.write(LINE[:-1] * (residues // 60) + "\n")
        else:
            f.write(LINE * (residues // 60))
    return path


def _gzip_bomb(path: Path, megabytes: int) -> Path:
    """A ``>bomb`` header and one line of ``megabytes`` MiB of residues, as concatenated gzip
    members of 1 MiB each (about 1 KiB per member on disk)."""
    member = gzip.compress(b"A" * (1 << 20), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(b">bomb\n"))
        for _ in range(megabytes):
            f.write(member)
    return path


def test_long_inputs_are_refused_after_the_limit(tmp_path):
    """A 64 MB single-line protein, a 1 MB gzip of a 1 GiB line and /dev/zero are refused
    with the file, record and limit named, having added at most 24 MiB of memory."""
    big = _fasta(tmp_path / "big.fasta", 64_000_000, one_line=True)
    bomb = _gzip_bomb(tmp_path / "bomb.fa.gz", 1024)
    assert bomb.stat().st_size < 2_000_000
    for path, message in [
        (big, "big.fasta:2: a line longer than 1,000,000 characters"),
        (bomb, "bomb.fa.gz:2: a line longer than 1,000,000 characters"),
        (Path("/dev/zero"), "/dev/zero:1: a line longer than 1,000,000 characters"),
    ]:
        got = _child("read", path)
        assert got["outcome"].startswith("ProteinInputError: ") and message in got["outcome"]
        assert ENV_MAX_PROTEIN_LENGTH in got["outcome"]
        assert got["added_mb"] < 24, (path, got)


def test_an_accepted_long_protein_stays_within_the_bound(tmp_path):
    """With the limit raised, an 8M-residue protein in 60-residue lines is read with at most
    3 bytes per residue added to the peak RSS."""
    n = 60 * 133_334  # 8,000,040 residues
    got = _child("read", _fasta(tmp_path / "long.fasta", n), limit=n)
    assert got["outcome"] == "ok" and got["residues"] == n
    assert got["added_mb"] < 3 * n / (1 << 20), got


def test_a_sample_of_a_long_protein_allocates_its_window_only():
    """A training sample of an 8M-residue protein is cut from the text before tokenizing:
    the sample allocates kilobytes (tokenizing it whole took 8 bytes per residue)."""
    import tracemalloc

    from epochal.data import ESMMaskedResidueDataset

    protein = LINE[:-1] * 133_334
    dataset = ESMMaskedResidueDataset({"giant": protein}, [["giant"]], seed=1, max_seq_length=32)
    dataset[(0, 0)]  # (first-call allocations of torch are not the sample's)
    tracemalloc.start()
    try:
        sample = dataset[(1, 0)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sample["text"].shape == (32,)
    assert peak < 1 << 20, peak
