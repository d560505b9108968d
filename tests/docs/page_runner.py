"""Run a documentation page's blocks in document order in one folder (see :mod:`.markdown_blocks`).

- ``file`` blocks are written to their name under the folder;
- ``python`` blocks run with ``exec`` in one namespace per page, the folder as the
  working directory;
- ``bash`` blocks run one command line at a time. A line that is a plain ``epochal
  ...`` command (no shell syntax: pipes, ``$``, globs, ``;``, ``&&``; at most a final
  ``> FILE``, which gets the command's standard output; at most a leading
  ``OMP_NUM_THREADS=N``, which sets torch's thread count too) runs in this process through
  :func:`epochal.cli.main`, which is what the
  ``epochal`` script calls, saving a Python start per command (the working directory,
  the environment and torch's thread count are restored after it, as a process of
  its own would leave them); any other line runs with ``bash -c`` in the folder.
  Every command must exit 0.

What a page states a block prints is checked against what it printed (see
:mod:`.markdown_blocks`): an ``<!-- output -->`` block against the output of the
nearest block above it that ran, and a python line's ``# -> TEXT`` against its own
block's output (python blocks' output is captured for this).

Each command's output is returned so that callers can check it.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tests.dist_utils import run_process
from tests.docs.markdown_blocks import (
    Block,
    command_lines,
    page_blocks,
    stated_output_missing,
    stated_prints,
)

__all__ = ["CommandResult", "PageRunner", "is_plain_epochal"]

_SHELL_SYNTAX = set("|&;<>()$`*?~{}") | {"\n"}


def is_plain_epochal(command: str) -> bool:
    """Whether ``command`` is ``epochal ARGS [> FILE]`` with nothing else the shell would interpret."""
    return _plain_epochal(command) is not None


def _plain_epochal(command: str) -> tuple[list[str], str | None] | None:
    """``(argv after "epochal", the file of a final "> FILE" or None)``, or None for other lines."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        return None
    target = None
    if len(tokens) >= 3 and tokens[-2] == ">" and not set(tokens[-1]) & _SHELL_SYNTAX:
        tokens, target = tokens[:-2], tokens[-1]
        command = command[: command.rindex(">")]
    if not tokens or tokens[0] != "epochal":
        return None
    outside_quotes = "".join(part for i, part in enumerate(_split_quotes(command)) if i % 2 == 0)
    try:
        same_words = shlex.split(command) == tokens
    except ValueError:  # the ">" was inside quotes
        return None
    if not same_words or _SHELL_SYNTAX & set(outside_quotes):
        return None
    return tokens[1:], target


#: environment assignments a command line may start with and still run in this process
#: (their effect is reproduced: the variable set, and torch's thread count for OpenMP's)
_IN_PROCESS_ENV = ("OMP_NUM_THREADS",)


def _env_prefix(command: str) -> tuple[dict[str, str], str]:
    """``({name: value}, the rest)`` of a line starting with ``OMP_NUM_THREADS=N`` (else ``({}, line)``)."""
    env: dict[str, str] = {}
    rest = command.lstrip()
    while True:
        word, _, after = rest.partition(" ")
        name, eq, value = word.partition("=")
        if not eq or name not in _IN_PROCESS_ENV or not value.isdigit():
            return env, rest
        env[name] = value
        rest = after.lstrip()


def _split_quotes(command: str) -> list[str]:
    """``command`` cut at its quote characters: even pieces are outside quotes, odd ones inside."""
    pieces, current, quote = [], "", None
    for ch in command:
        if quote is None and ch in "'\"":
            pieces.append(current)
            current, quote = "", ch
        elif ch == quote:
            pieces.append(current)
            current, quote = "", None
        else:
            current += ch
    pieces.append(current)
    return pieces


def _check_stated(block: Block, stated: list[str], printed: str) -> None:
    """Assert that ``printed`` has what ``block`` states (an output block, ``# ->`` comments)."""
    missing = stated_output_missing(stated, printed)
    assert not missing, (
        f"{block.where}: the page states an output that was not printed: {missing}\n"
        f"printed:\n{printed[-6000:]}"
    )


@dataclass
class CommandResult:
    """One command: where it came from, its exit status and its output (stdout + stderr)."""

    where: str
    command: str
    returncode: int
    output: str


@dataclass
class PageRunner:
    """Runs pages in ``folder`` with ``env`` (HOME and the like) for subprocesses.

    Attributes:
        folder: the working directory of every block.
        env: the environment of ``bash -c`` commands (the in-process ones see
            ``os.environ``: the caller sets the same variables there).
        read_output: returns the output captured since its last call (pytest's
            ``capfd.readouterr``), for in-process commands.
        rewrite: maps a command line to the line actually run (identity by default).
        timeout: seconds per ``bash -c`` command.
    """

    folder: Path
    env: dict[str, str]
    read_output: Callable[[], tuple[str, str]]
    rewrite: Callable[[str], str] = lambda line: line
    timeout: float = 300
    results: list[CommandResult] = field(default_factory=list)

    def run_page(self, page: Path, namespace: dict | None = None) -> Iterator[CommandResult]:
        """Run every block of ``page``; yield each command's result (after asserting exit 0)."""
        namespace = {"__name__": "docs_page"} if namespace is None else namespace
        printed = ""  # what the last block that ran printed
        for block in page_blocks(page):
            if block.file is not None:
                target = self.folder / block.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code)
            elif block.output:
                _check_stated(block, [block.code], printed)
            elif block.runs and block.lang == "python":
                printed = self._python(block, namespace)
                _check_stated(block, stated_prints(block.code), printed)
            elif block.runs:
                printed = ""
                for line in command_lines(block.code):
                    result = self._command(block, self.rewrite(line))
                    self.results.append(result)
                    assert result.returncode == 0, (
                        f"{result.where}: `{result.command}` exited {result.returncode}\n"
                        f"{result.output[-6000:]}"
                    )
                    printed += result.output
                    yield result

    def _python(self, block: Block, namespace: dict) -> str:
        """Run a python block as ``python`` would in the folder (the cwd, on sys.path); its output."""
        cwd = os.getcwd()
        os.chdir(self.folder)
        sys.path.insert(0, str(self.folder))
        self.read_output()  # drop what came before
        try:
            exec(compile(block.code, f"{block.where} (python)", "exec"), namespace)  # noqa: S102
        finally:
            sys.path.remove(str(self.folder))
            os.chdir(cwd)
        out, err = self.read_output()
        return out + err

    def _command(self, block: Block, line: str) -> CommandResult:
        env, rest = _env_prefix(line)
        plain = _plain_epochal(rest)
        if plain is not None:
            from epochal.cli import main as cli_main

            argv, target = plain
            self.read_output()  # drop what came before
            cwd, environ, threads = os.getcwd(), dict(os.environ), torch.get_num_threads()
            os.chdir(self.folder)
            os.environ.update(env)
            if "OMP_NUM_THREADS" in env:  # what the variable does to a fresh process's torch
                torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
            try:
                rc = cli_main(argv)
            except SystemExit as exc:  # argparse: --help, usage errors
                rc = exc.code if isinstance(exc.code, int) else 1
            finally:  # what a process of its own would not leave behind
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(environ)
                torch.set_num_threads(threads)
            out, err = self.read_output()
            if target is not None:  # "> FILE": the standard output goes there
                (self.folder / target).write_text(out)
                out = ""
            return CommandResult(block.where, line, rc, out + err)
        done = run_process(
            ["bash", "-c", line], env=self.env, cwd=self.folder, timeout=self.timeout
        )
        return CommandResult(block.where, line, done.returncode, done.stdout + done.stderr)
