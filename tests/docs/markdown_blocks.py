"""The code blocks of a documentation page, with the conventions that say how each is run.

A page's fenced blocks are read in document order. The line right before an opening
fence may be one of three markers:

- ``<!-- not run: REASON -->``: the block is shown, never run (a GPU, several nodes,
  a download, a package install);
- ``<!-- file: NAME -->``: the block is a file that later commands use; it is written
  to ``NAME`` (relative to the page's folder) when its turn comes;
- ``<!-- output -->``: the block is what the nearest block above it that runs prints
  (all its commands' output together); the docs tests check it (:func:`stated_output_missing`).

Otherwise ```` ```bash ```` blocks run line by line (a line ending in ``\\`` continues
on the next; blank lines and ``#`` comment lines are skipped), ```` ```python ````
blocks run in one namespace per page, and every other language is shown only.

A python line may state what it prints in a trailing ``# -> TEXT`` comment
(``print(x.shape)  # -> torch.Size([2, 32])``), or a comment line of its own below it (a
long line); the tests check those too, in order, against the block's output.

A stated output matches when it appears in the printed output in order, with every run
of whitespace (line breaks included, so a long line may be wrapped) standing for any
whitespace, and ``...`` for any text (a line of its own: any lines). It must start and
end at whitespace or at the output's ends, so ``48 documents`` does not match ``948
documents``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Block", "command_lines", "page_blocks", "stated_output_missing", "stated_prints"]

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
_MARKER = re.compile(
    r"^\s*<!--\s*(?:(?P<kind>not run|file)\s*:\s*(?P<value>.*?)|(?P<output>output))\s*-->\s*$"
)
#: A python line's stated output: ``code  # -> TEXT``.
_STATED_PRINT = re.compile(r"#\s*->\s*(?P<text>.*?)\s*$")
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
        output: an ``output`` marker: the block states what the block before it prints.
    """

    page: Path
    line: int
    lang: str
    code: str
    skip: str | None = None
    file: str | None = None
    output: bool = False

    @property
    def runs(self) -> bool:
        """A bash or python block without a marker."""
        return (
            self.skip is None
            and self.file is None
            and not self.output
            and self.lang in RUN_LANGUAGES
        )

    @property
    def where(self) -> str:
        """``page:line`` for messages."""
        return f"{self.page.name}:{self.line}"


def page_blocks(path: str | Path) -> list[Block]:
    """Every fenced block of a Markdown page, in document order.

    Raises:
        ValueError: an unclosed fence, a marker that is not right before a fence, or an
            ``output`` marker with no block that runs above it (names the page and line).
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        marker = _MARKER.match(lines[i])
        if marker and not (i + 1 < len(lines) and _FENCE.match(lines[i + 1])):
            kind = marker["kind"] or "output"
            raise ValueError(f"{path}:{i + 1}: a '{kind}' marker must precede a fence")
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
        output = bool(before and before["output"])
        if output and not any(b.runs for b in blocks):
            raise ValueError(f"{path}:{i}: an 'output' marker needs a block that runs above it")
        blocks.append(
            Block(
                page=path,
                line=i + 1,
                lang=match["lang"],
                code="\n".join(body) + "\n",
                skip=before["value"] if before and before["kind"] == "not run" else None,
                file=before["value"] if before and before["kind"] == "file" else None,
                output=output,
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


def stated_prints(code: str) -> list[str]:
    """The ``# -> TEXT`` comments of a python block, in order (trailing or on a line of their own)."""
    return [m["text"] for m in map(_STATED_PRINT.search, code.splitlines()) if m]


def _pattern(stated: str) -> re.Pattern[str]:
    """``stated`` as a regular expression: whitespace runs match any, ``...`` any text."""
    pieces = [re.escape(" ".join(piece.split())) for piece in stated.split("...")]
    body = ".*?".join(p.replace(r"\ ", r"\s+") for p in pieces)
    start = "" if stated.lstrip().startswith("...") else r"(?<!\S)"
    end = "" if stated.rstrip().endswith("...") else r"(?!\S)"
    return re.compile(start + body + end, re.S)


def stated_output_missing(stated: list[str], printed: str) -> list[str]:
    """The pieces of ``stated`` that ``printed`` lacks (each searched after the previous match).

    Args:
        stated: what a page says a block prints: an ``output`` block's text, or the
            ``# -> TEXT`` comments of a python block.
        printed: what the block printed (standard output and error).

    Returns:
        The stated pieces not found, in order; ``[]`` when all are there.
    """
    missing, position = [], 0
    for piece in stated:
        if not piece.strip() or piece.strip() == "...":
            continue
        found = _pattern(piece.strip()).search(printed, position)
        if found is None:
            missing.append(piece)
        else:
            position = found.end()
    return missing
