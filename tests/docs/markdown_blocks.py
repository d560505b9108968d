"""The code blocks of a documentation page, with the conventions that say how each is run.

A page's fenced blocks are read in document order. The line right before an opening
fence may be one of two markers:

- ``<!-- not run: REASON -->``: the block is shown, never run (a GPU, several nodes,
  a download, a package install);
- ``<!-- file: NAME -->``: the block is a file that later commands use; it is written
  to ``NAME`` (relative to the page's folder) when its turn comes.

Otherwise ```` ```bash ```` blocks run line by line (a line ending in ``\\`` continues
on the next; blank lines and ``#`` comment lines are skipped), ```` ```python ````
blocks run in one namespace per page, and every other language is shown only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "command_lines", "page_blocks"]

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>not run|file)\s*:\s*(?P<value>.*?)\s*-->\s*$")
RUN_LANGUAGES = ("bash", "python")


@dataclass(frozen=True)
class Block:
    """One fenced code block.

    Attributes:
        page: the Markdown file.
        line: 1-based line of the opening fence.
        lang: the fence's language (``""`` if none).
        code: the block's text, de-indented by the fence's indentation.
        skip: the reason of a ``not run`` marker, else None.
        file: the name of a ``file`` marker, else None.
    """

    page: Path
    line: int
    lang: str
    code: str
    skip: str | None = None
    file: str | None = None

    @property
    def runs(self) -> bool:
        """A bash or python block without a marker."""
        return self.skip is None and self.file is None and self.lang in RUN_LANGUAGES

    @property
    def where(self) -> str:
        """``page:line`` for messages."""
        return f"{self.page.name}:{self.line}"


def page_blocks(path: str | Path) -> list[Block]:
    """Every fenced block of a Markdown page, in document order.

    Raises:
        ValueError: an unclosed fence, or a marker that is not right before a fence
            (names the page and line).
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        marker = _MARKER.match(lines[i])
        if marker and not (i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
            raise ValueError(f"{path}:{i + 1}: a '{marker['kind']}' marker must precede a fence")
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: unclosed code fence")
        before = _MARKER.match(lines[i - 1]) if i else None
        blocks.append(
            Block(
                page=path,
                line=i + 1,
                lang=match["lang"],
                code="\n".join(body) + "\n",
                skip=before["value"] if before and before["kind"] == "not run" else None,
                file=before["value"] if before and before["kind"] == "file" else None,
            )
        )
        i = j + 1
    return blocks


def command_lines(code: str) -> list[str]:
    """The commands of a bash block: ``\\`` continuations joined, blanks and comments dropped."""
    commands: list[str] = []
    pending = ""
    for raw in code.splitlines():
        line = pending + raw.strip() if pending else raw.rstrip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    if pending.strip():
        commands.append(pending.strip())
    return commands
