"""The block conventions of documentation pages, and which command lines run in-process."""

from __future__ import annotations

import pytest

from tests.docs.markdown_blocks import command_lines, page_blocks
from tests.docs.page_runner import _plain_epochal

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
