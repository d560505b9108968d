"""The README's Python examples run as written (paths under /tmp redirected to a temp dir).

Sections whose examples need a trained run or minutes of CPU (Training, Converting)
are exercised by the CLI tests instead; the list below says which blocks run. The
shell commands of the subsections in :data:`RUNNABLE_COMMANDS` run as written, one
line at a time, in a temporary folder (with its own cache) holding their inputs.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
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
)


#: ``(section, subsection)`` whose ``bash`` blocks run line by line.
RUNNABLE_COMMANDS = (("Proteins", "Pretraining from FASTA"),)


def command_lines(section: str, subsection: str) -> list[str]:
    """The command lines of the ``bash`` blocks of ``## section`` / ``### subsection``."""
    for part in re.split(r"^## ", README.read_text(), flags=re.M)[1:]:
        if part.startswith(section):
            for sub in re.split(r"^### ", part, flags=re.M)[1:]:
                if sub.startswith(subsection):
                    code = "\n".join(re.findall(r"```bash\n(.*?)```", sub, flags=re.S))
                    return [line for line in code.splitlines() if line.strip()]
    raise AssertionError(f"README.md has no ### {subsection} under ## {section}")


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


def test_protein_pretraining_commands_run(tmp_path):
    """FASTA -> train (stops at step 100) -> resume on two DP ranks -> HF export -> fill-mask."""
    from epochal.train.inputs.synthetic_proteins import synthetic_families

    families = synthetic_families(40, seed=3)
    fasta = "".join(f">{pid}\n{seq}\n" for family in families for pid, seq in family)
    (tmp_path / "proteins.fasta").write_text(fasta)
    env = {**os.environ, "EPOCHAL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    outputs = []
    for line in command_lines(*RUNNABLE_COMMANDS[0]):
        done = subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "stopped early (training.exit_interval=100) after step 100" in outputs[0]
    assert "trained steps 101-200 (resumed from step 100)" in outputs[1]
    assert "sample order and masks differed in every epoch" in outputs[1]
    assert (tmp_path / "hf/esm-tiny/vocab.txt").is_file()
    assert "[MASK] 0:" in outputs[3]


def test_protein_finetuning_and_embedding_commands_run(tmp_path):
    """Fine-tuning (a sequence head with its own LR; a residue head with LoRA, merged) and embed."""
    import json

    import pyarrow.parquet as pq
    from safetensors import safe_open

    from epochal.cli import main as cli_main

    setup = "\n".join(
        re.findall(
            r"```python\n(.*?)```",
            README.read_text().split("### Fine-tuning ESM", 1)[1].split("## Parallel training")[0],
            flags=re.S,
        )
    )
    exec(compile(setup.replace("/tmp/", f"{tmp_path}/"), "README.md: fine-tuning", "exec"), {})  # noqa: S102
    lines = command_lines("Proteins", "Fine-tuning ESM") + command_lines("Proteins", "Embeddings")
    commands: list[str] = []
    for line in lines:  # a line ending in a backslash continues on the next
        if commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1] + " " + line
        else:
            commands.append(line)
    for command in commands:
        argv = shlex.split(command.replace("/tmp/", f"{tmp_path}/"))[1:]
        assert cli_main(argv) == 0, argv
    with safe_open(str(tmp_path / "proteins/query.safetensors"), "pt") as f:
        assert f.get_tensor("embeddings").shape == (5, 64)
        assert json.loads(f.metadata()["ids"]) == [f"q{i}" for i in range(5)]
    rows = pq.read_table(tmp_path / "proteins/valid.parquet").to_pylist()
    assert len(rows) == 16 and {r["predicted_label"] for r in rows} <= {"insoluble", "soluble"}
    assert (tmp_path / "proteins/structure-merged").is_dir()
