"""The block conventions of documentation pages, and which command lines run in-process."""

from __future__ import annotations

import os

import pytest

from tests.docs.markdown_blocks import (
    command_lines,
    page_blocks,
    stated_output_missing,
    stated_prints,
)
from tests.docs.page_runner import PageRunner, _env_prefix, _plain_epochal

PAGE = """# A page

<!-- not run: needs a GPU -->
```bash
epochal train --preset gpu-1b
```

<!-- file: job.toml -->
```toml
[training]
train_iters = 5
```

```bash
# a comment
epochal train --config job.toml \\
    --run_dir=runs/a
python -c "print(1)"
```

```text
shown only
```
"""


def test_markers_and_languages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    gpu, job, commands, text = page_blocks(page)
    assert (gpu.skip, gpu.runs) == ("needs a GPU", False)
    assert (job.file, job.runs, job.code) == ("job.toml", False, "[training]\ntrain_iters = 5\n")
    assert commands.runs and not text.runs and text.lang == "text"
    assert command_lines(commands.code) == [
        "epochal train --config job.toml --run_dir=runs/a",
        'python -c "print(1)"',
    ]


def test_a_marker_away_from_a_fence_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- not run: x -->\n\ntext\n")
    with pytest.raises(ValueError, match="page.md:1: a 'not run' marker must precede a fence"):
        page_blocks(page)
    page.write_text("```bash\nepochal train\n")
    with pytest.raises(ValueError, match="unclosed code fence"):
        page_blocks(page)


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        ("epochal train --x=1", (["train", "--x=1"], None)),
        ('epochal train --d=\'["a", "b"]\'', (["train", '--d=["a", "b"]'], None)),
        ("epochal train --print-config > my.toml", (["train", "--print-config"], "my.toml")),
        ("epochal train | tee log", None),
        ("epochal train > $HOME/x", None),
        ("epochal train && ls", None),
        ("epochal x '>' y", None),
        ("ls runs", None),
    ],
)
def test_which_lines_run_in_process(line, plain):
    assert _plain_epochal(line) == plain


@pytest.mark.parametrize(
    ("line", "env", "rest"),
    [
        ("OMP_NUM_THREADS=1 epochal train", {"OMP_NUM_THREADS": "1"}, "epochal train"),
        ("epochal train", {}, "epochal train"),
        ("CUDA_VISIBLE_DEVICES=0 epochal train", {}, "CUDA_VISIBLE_DEVICES=0 epochal train"),
        ("OMP_NUM_THREADS=$N epochal train", {}, "OMP_NUM_THREADS=$N epochal train"),
    ],
)
def test_only_a_thread_count_prefix_stays_in_process(line, env, rest):
    assert _env_prefix(line) == (env, rest)


STATED = """# Stated outputs

```python
import torch

print(torch.zeros(1, 24, 33).shape)  # -> {shape}
print(348, "docstrings")
# -> 348 docstrings
```

```bash
printf 'data: 948 documents, 12 tokens\\nmodel: 1 layer\\n'
```

Prose between a block and its output.

<!-- output -->
```text
data: {documents} documents, ...
model: 1 layer
```
"""


def _runner(tmp_path, capfd) -> PageRunner:
    return PageRunner(folder=tmp_path, env=dict(os.environ), read_output=capfd.readouterr)


def test_stated_outputs_are_read_from_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(STATED.format(shape="torch.Size([1, 24, 33])", documents=948))
    python, bash, output = page_blocks(page)
    assert python.runs and bash.runs and not output.runs and output.output
    assert stated_prints(python.code) == ["torch.Size([1, 24, 33])", "348 docstrings"]
    page.write_text("<!-- output -->\n```text\n1\n```\n")
    with pytest.raises(ValueError, match="page.md:1: an 'output' marker needs a block that runs"):
        page_blocks(page)


@pytest.mark.parametrize(
    ("stated", "printed", "missing"),
    [
        (["348 docstrings"], "348 docstrings\n", []),
        (["48 docstrings"], "348 docstrings\n", ["48 docstrings"]),  # whole words only
        (["a long line\nwrapped"], "x\na long line wrapped\n", []),  # whitespace is any
        (["data: ... tokens"], "data: 9 documents, 7 tokens\n", []),
        (["first\n...\nlast"], "first\nmiddle\nlast\n", []),
        (["b", "a"], "a\nb\n", ["a"]),  # in order
        (["[1, 28, 33]"], "torch.Size([1, 24, 33])", ["[1, 28, 33]"]),
    ],
)
def test_what_a_stated_output_matches(stated, printed, missing):
    assert stated_output_missing(stated, printed) == missing


@pytest.mark.parametrize(
    ("shape", "documents", "wrong"),
    [
        ("torch.Size([1, 24, 33])", 948, None),
        ("torch.Size([1, 28, 33])", 948, "torch.Size([1, 28, 33])"),
        ("torch.Size([1, 24, 33])", 348, "data: 348 documents"),
    ],
)
def test_a_page_whose_stated_output_differs_fails(tmp_path, capfd, shape, documents, wrong):
    page = tmp_path / "page.md"
    page.write_text(STATED.format(shape=shape, documents=documents))
    run = _runner(tmp_path, capfd).run_page(page)
    if wrong is None:
        assert [r.output for r in run] == ["data: 948 documents, 12 tokens\nmodel: 1 layer\n"]
        return
    with pytest.raises(AssertionError, match="the page states an output that was not printed") as e:
        list(run)
    assert wrong in str(e.value) and "page.md:" in str(e.value)
