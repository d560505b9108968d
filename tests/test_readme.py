"""The README's Python examples run as written (paths under /tmp redirected to a temp dir).

Sections whose examples need a trained run or minutes of CPU (Training, Converting)
are exercised by the CLI tests instead; the list below says which blocks run. In the
sections of :data:`COMMANDS` every ``epochal`` command of the ``bash`` blocks runs too
(after the section's Python), in order, through ``epochal.cli.main``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
RUNNABLE = (
    "Multi-epoch data",
    "Testing your dataset for determinism",
    "Resumable loading",
    "Indexed files and preprocessing",
    "GPT samples, splits and blending",
    "Models",
    "Train steps and BERT training",
    "T5: encoder-decoder models",
    "Proteins",
)
#: Sections whose ``bash`` blocks' ``epochal ...`` commands run as well.
COMMANDS = ("Proteins",)


def bash_commands(name: str) -> list[list[str]]:
    """The ``epochal`` commands of section ``name``'s bash blocks (continuations joined), as argv."""
    import shlex

    for section in re.split(r"^## ", README.read_text(), flags=re.M)[1:]:
        if section.splitlines()[0].startswith(name):
            text = "\n".join(re.findall(r"```bash\n(.*?)```", section, flags=re.S))
            lines = text.replace("\\\n", " ").splitlines()
            return [shlex.split(line)[1:] for line in lines if line.startswith("epochal ")]
    return []


def python_blocks() -> dict[str, str]:
    """``{section heading: its python blocks, in order}`` for the runnable sections.

    The blocks of one section (its ``###`` parts included) run in one namespace.
    """
    blocks: dict[str, str] = {}
    for section in re.split(r"^## ", README.read_text(), flags=re.M)[1:]:
        heading = section.splitlines()[0]
        code = re.findall(r"```python\n(.*?)```", section, flags=re.S)
        for name in RUNNABLE:
            if heading.startswith(name) and code:
                blocks[name] = "\n".join(code)
    return blocks


def test_every_runnable_section_has_an_example():
    assert sorted(python_blocks()) == sorted(RUNNABLE)


@pytest.mark.parametrize("name", RUNNABLE)
def test_readme_example_runs(name, tmp_path, monkeypatch):
    code = python_blocks()[name].replace("/tmp/", f"{tmp_path}/")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(code, f"README.md: {name}", "exec"), namespace)  # noqa: S102
    if name in COMMANDS:
        from epochal.cli import main as cli_main

        commands = bash_commands(name)
        assert commands
        for argv in commands:
            argv = [a.replace("/tmp/", f"{tmp_path}/") for a in argv]
            assert cli_main(argv) == 0, argv
    if name == "Proteins":
        import json

        import pyarrow.parquet as pq
        from safetensors import safe_open

        with safe_open(str(tmp_path / "proteins/query.safetensors"), "pt") as f:
            assert f.get_tensor("embeddings").shape == (5, 64)
            assert json.loads(f.metadata()["ids"]) == [f"q{i}" for i in range(5)]
        rows = pq.read_table(tmp_path / "proteins/valid.parquet").to_pylist()
        assert len(rows) == 16 and {r["predicted_label"] for r in rows} <= {"insoluble", "soluble"}
        assert (tmp_path / "proteins/structure-merged").is_dir()
    if name == "Testing your dataset for determinism":
        from epochal.data import MaskedTokenDataset

        dataset = MaskedTokenDataset(
            [[5, 6, 7, 8, 9, 10]] * 4, mask_token_id=1, random_tokens=range(5, 12), mask_prob=0.5
        )
        namespace["test_my_dataset"](dataset)
    if name == "Train steps and BERT training":
        logged = namespace["trainer"].last_eval_logged
        assert set(logged) == {"lm loss", "mlm accuracy", "mlm ppl", "masked accuracy"}
        assert namespace["result"].final_step == 6
        # the callback's accuracy is the step's own mlm accuracy, from the gathered logits
        assert logged["masked accuracy"] == pytest.approx(logged["mlm accuracy"], abs=1e-6)
        assert tuple(namespace["whole"].shape[:2]) == (8, 16)
    if name == "Resumable loading":
        assert namespace["state"] == {"consumed_samples": 96, "mode": "train"}
