"""A new user's first hour: the quick start, then every README and how-to command, in one home.

The commands of the getting-started pages, the README and every how-to page (in the
site's order) run one after another in one fresh home directory (the working
directory; ``~/.cache/epochal`` inside it), as a user would type them after the quick
start. Every command must exit 0 and none may say ``nothing to do``, print an
``epochal ...: error:`` line or a traceback: a command that collides with an earlier
one (the same run directory, the same output) fails here.

One change to what the pages say: the quick start's bare ``epochal train`` trains the
tiny preset for 300 steps (about 90 s on two cores); the walk runs it for 5 steps
(the same data, tokenizer, model and cache), which nothing later relies on.

Two tiers: the default one leaves out the how-to pages whose commands start several
processes or train the presets that tests of their own train (:data:`SLOW_WALK_PAGES`:
about 170 of the walk's 300 s on two cores; relaunching under torchrun, the layouts,
resuming on other layouts, expert and context parallelism are the parallel tests'
ground; BERT, T5, fine-tuning, SFT and generation the training and model tests'); the
``slow`` tier walks every page.
"""

from __future__ import annotations

import re

import pytest

from tests.docs.markdown_blocks import page_blocks
from tests.docs.site import DOCS, README, WALK_SECTIONS, nav_pages

QUICK_START = "getting-started/quick-start.md"
SHORTENED = {"epochal train": "epochal train --training.train_iters=5"}

FORBIDDEN = (
    re.compile(r"^nothing to do", re.M),
    re.compile(r"^epochal[\w -]*: error:", re.M),
    re.compile(r"^Traceback \(most recent call last\)", re.M),
)

#: What some commands must print: (page, a piece of the command, a piece of its output).
EXPECTED = [
    (
        "pretrain-esm2.md",
        "exit_interval",
        "stopped early (training.exit_interval=10) after step 10",
    ),
    ("pretrain-esm2.md", "runs/esm-tiny", "trained steps 11-20 (resumed from step 10)"),
    ("pretrain-esm2.md", "runs/esm-tiny", "sample order and masks differed in every epoch"),
    ("pretrain-esm2.md", "fill-mask", "[MASK] 0:"),
    ("resume-on-other-gpus.md", "data_parallel=2", "trained steps 6-10 (resumed from step 5)"),
    ("train-gpt-on-your-text.md", "--data.corpus=my-text.txt", "documents from my-text.txt"),
    ("parallel-layouts.md", "tensor_parallel=2", "trained steps 1-5"),
    ("deterministic-dataset.md", "pytest", "1 passed"),
    ("change-the-data-mix.md", "--data.blend_schedule=", "changed from step 11 on"),
    ("change-the-data-mix.md", "--data.blend_schedule=", "sample digests match the checkpoint"),
    ("change-the-data-mix.md", "--sources", "next starts at"),
]


#: The how-to pages the default tier leaves out (see the module docstring): their commands
#: start several processes, or train the presets whose own tests run the same commands
#: (BERT, T5, fine-tuning, SFT and generation: tests/train, tests/model).
SLOW_WALK_PAGES = {
    "inspect-samples.md",
    "parallel-layouts.md",
    "resume-on-other-gpus.md",
    "train-a-mixture-of-experts.md",
    "train-on-long-sequences.md",
    "train-bert-and-t5.md",
    "generate.md",
    "finetune-and-embed.md",
    "finetune-a-chat-model.md",
}


def walk_pages(every_page: bool = True):
    """The quick start, the README, then the getting-started and how-to pages in nav order.

    ``every_page=False`` leaves out :data:`SLOW_WALK_PAGES`.
    """
    pages = [path for section, path in nav_pages() if section in WALK_SECTIONS]
    ordered = [DOCS / QUICK_START, README] + [DOCS / p for p in pages if p != QUICK_START]
    names = {page.name for page in ordered}
    assert SLOW_WALK_PAGES <= names, f"not walked: {SLOW_WALK_PAGES - names}"
    return [p for p in ordered if every_page or p.name not in SLOW_WALK_PAGES]


def _shape(line: str) -> str:
    """The first two words of an output line, digits generalised."""
    return re.sub(r"\d+", "#", " ".join(line.split()[:2]))


@pytest.mark.timeout(3600)
@pytest.mark.parametrize(
    "every_page",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["one-process-pages", "every-page"],
)
def test_a_new_user_runs_every_command_in_one_home(tmp_path, make_runner, every_page):
    home = tmp_path / "home"
    runner = make_runner(home, home, rewrite=lambda line: SHORTENED.get(line, line))
    outputs: dict[str, list] = {}
    for page in walk_pages(every_page):
        namespace = {"__name__": "docs_page"}
        for result in runner.run_page(page, namespace):
            for pattern in FORBIDDEN:
                assert not pattern.search(result.output), (
                    f"{result.where}: `{result.command}` printed {pattern.pattern!r}\n"
                    f"{result.output[-4000:]}"
                )
            outputs.setdefault(page.name, []).append(result)
    for page, piece, expected in EXPECTED:
        if not every_page and page in SLOW_WALK_PAGES:
            continue
        found = [r for r in outputs[page] if piece in r.command]
        assert found, f"{page}: no command with {piece!r}"
        assert any(expected in r.output for r in found), (
            page,
            piece,
            expected,
            found[-1].output[-3000:],
        )
    # The quick start explains its output line by line: those lines are what it prints.
    quick = next(r for r in outputs["quick-start.md"] if r.command.startswith("epochal train"))
    printed = {_shape(line) for line in quick.output.splitlines() if line.strip()}
    explained = next(b for b in page_blocks(DOCS / QUICK_START) if b.lang == "text")
    missing = [line for line in explained.code.splitlines() if _shape(line) not in printed]
    assert missing == [], f"the quick start's output no longer has: {missing}"
