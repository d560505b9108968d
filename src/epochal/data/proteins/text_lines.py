"""Lines of a protein text file (FASTA, CSV/TSV, MMseqs2 TSV), plain or gzipped, read within a bound.

:class:`BoundedLines` yields ``(line number, text)`` pairs with these rules:

- gzip is recognised by its magic bytes (whatever the suffix) and decompressed as the
  lines are read, so a small file that expands to gigabytes costs no more memory
  than its longest line;
- text is UTF-8; a UTF-8 byte-order mark at the start is skipped; a line that is not
  UTF-8 (a Latin-1 or UTF-16 file) is refused, naming the file, line and byte;
- ``\\n`` and ``\\r\\n`` end lines (the line end is removed from the text);
- a line longer than :attr:`BoundedLines.limit` characters is refused as soon as that
  many have been read (``/dev/zero`` stops at the limit instead of filling memory).

Every error is the caller's exception class (``ProteinInputError``, ``LabelledDataError``)
with a message naming the file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from epochal.data.proteins.sequences import too_long

__all__ = ["BoundedLines"]

_BOM = b"\xef\xbb\xbf"


class BoundedLines:
    """The lines of ``path``, each at most ``limit`` characters (see the module docstring).

    Args:
        path: the file (plain or gzipped).
        limit: the longest line, in characters (bytes of UTF-8 are counted as read;
            a line is refused once it holds more than ``limit`` bytes).
        error: the exception class raised.

    Attributes:
        limit: may be raised between lines (a table's rows are longer than its header).
        what: how the refusal calls a line (a table's reader says "a row").
        line_number: the number of the last line read (from 1).

    Raises:
        error: (when iterated) the file cannot be opened or read (a broken gzip stream),
            a line is not UTF-8 or is over the limit.
    """

    def __init__(self, path: str | os.PathLike, limit: int, error: type[ValueError]) -> None:
        self.path = Path(path)
        self.limit = int(limit)
        self.error = error
        self.what = "a line"
        self.line_number = 0

    def _open(self):
        try:
            raw = open(self.path, "rb")
        except OSError as exc:
            raise self.error(f"{self.path}: cannot open ({exc.strerror or exc})") from exc
        try:
            if raw.peek(2)[:2] == b"\x1f\x8b":
                return gzip.GzipFile(fileobj=raw, mode="rb")
        except OSError as exc:
            raw.close()
            raise self.error(f"{self.path}: cannot read ({exc.strerror or exc})") from exc
        return raw

    def __iter__(self) -> Iterator[tuple[int, str]]:
        stream = self._open()
        try:
            while True:
                number = self.line_number + 1
                try:
                    data = stream.readline(self.limit + 2)
                except (OSError, EOFError, zlib.error) as exc:
                    raise self.error(
                        f"{self.path}: cannot read line {number} ({exc}); is the file complete?"
                    ) from exc
                if not data:
                    return
                if number == 1 and data.startswith(_BOM):
                    data = data[len(_BOM) :]
                body = data.rstrip(b"\r\n") if data.endswith(b"\n") else data
                if len(body) > self.limit or (len(data) > self.limit and not data.endswith(b"\n")):
                    raise self.error(too_long(f"{self.path}:{number}", self.what, self.limit))
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError as exc:
                    bad = body[exc.start : exc.start + 1]
                    raise self.error(
                        f"{self.path}:{number}: not UTF-8 text (byte 0x{bad.hex()} at column "
                        f"{exc.start + 1}); save the file as UTF-8"
                    ) from None
                self.line_number = number
                yield number, text
        finally:
            stream.close()
