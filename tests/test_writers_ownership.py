"""No epochal writer deletes, rewrites or writes into what another run or command wrote.

A fuzz over the writers (``train``, ``save_state``, ``convert``, ``embed``, ``merge``,
``preprocess``, ``config``): each is pointed at every writer's outputs (the output
itself, and folders and files inside it). Every case must be refused before anything
is written, naming the path, and the victim's files must stay byte for byte as they
were (nothing added, removed or changed). The victims are made once by the real
writers on tiny inputs (the ``save_state`` folder is a run's checkpoints folder copied
out: ``save_state`` writes the same layout) and copied for each case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from epochal.cli import main as cli_main

TINY = [
    "--training.device=cpu",
    "--data.mock=true",
    "--data.seq_length=16",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.ffn_hidden_size=64",
    "--model.vocab_size=128",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """``victims/``: one output of each writer; ``sources/``: inputs for the writers."""
    root = tmp_path_factory.mktemp("writers")
    v, s = root / "victims", root / "sources"
    v.mkdir()
    s.mkdir()
    run = v / "run"
    assert cli_main(["train", f"--run_dir={run}", *TINY, "--training.train_iters=2",
                     "--checkpoint.save_interval=1", "--checkpoint.keep_last=2"]) == 0  # fmt: skip
    shutil.copytree(run / "checkpoints", v / "state")  # accelerator.save_state's layout
    shutil.copytree(run, s / "run")
    assert cli_main(["convert", str(s / "run"), str(v / "hf"), "--to", "hf"]) == 0
    docs = s / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": f"document {i} " * 5}) + "\n" for i in range(8)))
    pre = ["preprocess", "--tokenizer-type", "bytes", "--no-progress", "--input", str(docs)]
    assert cli_main([*pre, "--output-prefix", str(v / "corpus")]) == 0
    assert cli_main([*pre, "--output-prefix", str(s / "src")]) == 0
    assert cli_main(["merge", str(s / "src_text_document"), "--output-prefix",
                     str(v / "m_text_document")]) == 0  # fmt: skip
    from epochal.commands.embed import write_output

    result = {"embeddings": torch.zeros(2, 4), "lengths": torch.tensor([3, 3])}
    write_output(v / "emb.safetensors", result, ["a", "b"], ["MKV", "MKL"], None)
    assert cli_main(["config", "--defaults", "-o", str(v / "job.toml")]) == 0
    (s / "p.fasta").write_text(">a\nMKV\n")
    return root


def _write(writer: str, target: Path, src: Path) -> int:
    if writer == "train":
        return cli_main(["train", f"--run_dir={target}", *TINY, "--training.train_iters=1"])
    if writer == "save_state":
        from epochal.accelerate import checkpointing

        try:  # the guard comes first: nothing of the trainer is touched when it refuses
            checkpointing.save_state(None, target, [])
        except ValueError as exc:
            import sys

            print(f"save_state: {exc}", file=sys.stderr)
            return 2
        return 0
    if writer == "convert":
        return cli_main(["convert", str(src / "run"), str(target), "--to", "hf", "--overwrite"])
    if writer == "embed":
        return cli_main(["embed", "--checkpoint", str(src / "run"), "--input",
                         str(src / "p.fasta"), "--output", str(target)])  # fmt: skip
    if writer == "merge":
        return cli_main(["merge", str(src / "src_text_document"), "--output-prefix", str(target)])
    if writer == "preprocess":
        return cli_main(["preprocess", "--tokenizer-type", "bytes", "--no-progress", "--input",
                         str(src / "docs.jsonl"), "--output-prefix", str(target)])  # fmt: skip
    assert writer == "config"
    return cli_main(["config", "--defaults", "-o", str(target)])


# writer -> victim -> targets (relative to victims/); a writer whose outputs cannot be
# named like the victim's (merge's PREFIX.bin and a .toml) is pointed inside folders only
CASES = {
    "train": {
        "train": ["run/checkpoints", "run/checkpoints/step_0000002", "run/checkpoints/new"],
        "save_state": ["state", "state/step_0000002", "state/new"],
        "convert": ["hf", "hf/run"],
        "embed": ["emb.safetensors"],
        "preprocess": ["corpus_text_document.bin"],
        "merge": ["m_text_document.idx"],
        "config": ["job.toml"],
        "all": ["."],
    },
    "save_state": {
        "train": ["run", "run/checkpoints", "run/checkpoints/step_0000002", "run/new"],
        "save_state": ["state/step_0000002"],
        "convert": ["hf", "hf/state"],
        "embed": ["emb.safetensors"],
        "preprocess": ["corpus_text_document.bin"],
        "merge": ["m_text_document.bin"],
        "config": ["job.toml"],
    },
    "convert": {
        "train": ["run", "run/checkpoints", "run/checkpoints/step_0000002", "run/hf"],
        "save_state": ["state", "state/step_0000002", "state/hf"],
        "convert": ["hf/inner"],
        "embed": ["emb.safetensors"],
        "preprocess": ["corpus_text_document.idx"],
        "merge": ["m_text_document.bin"],
        "config": ["job.toml"],
    },
    "embed": {
        "train": ["run/e.safetensors", "run/checkpoints/step_0000002/e.parquet"],
        "save_state": ["state/e.safetensors", "state/step_0000002/e.parquet"],
        "convert": ["hf/model.safetensors", "hf/e.parquet"],
        "preprocess": ["corpus_text_document.bin"],
        "merge": ["m_text_document.idx"],
        "config": ["job.toml"],
    },
    "merge": {
        "train": ["run/m", "run/checkpoints/step_0000002/m", "run/checkpoints/m"],
        "save_state": ["state/m", "state/step_0000002/m"],
        "convert": ["hf/model"],
        "preprocess": ["corpus_text_document"],
    },
    "preprocess": {
        "train": ["run/p", "run/checkpoints/step_0000002/p"],
        "save_state": ["state/p", "state/step_0000002/p"],
        "convert": ["hf/p"],
        "merge": ["m"],
    },
    "config": {
        "train": [
            "run/config.toml",
            "run/metrics.jsonl",
            "run/checkpoints/latest",
            "run/checkpoints/step_0000002/config.toml",
        ],  # fmt: skip
        "save_state": ["state/latest", "state/step_0000002/trainer_state.json"],
        "convert": ["hf/config.json"],
        "embed": ["emb.safetensors"],
        "preprocess": ["corpus_text_document.idx", "corpus_text_document.tokenizer.json"],
        "merge": ["m_text_document.bin"],
    },
}


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    ("writer", "victim", "target"),
    [(w, v, t) for w, victims in CASES.items() for v, ts in victims.items() for t in ts],
)
def test_no_writer_touches_another_writers_output(made, tmp_path, capsys, writer, victim, target):
    victims = tmp_path / "victims"
    shutil.copytree(made / "victims", victims)
    before = _snapshot(victims)
    path = victims / target
    capsys.readouterr()
    rc = _write(writer, path, made / "sources")
    err = capsys.readouterr().err
    assert rc != 0, f"epochal {writer} wrote {target} ({victim}'s)"
    assert str(path) in err, err  # the refusal names the path
    assert _snapshot(victims) == before  # nothing written, replaced or removed


def test_a_writer_may_replace_its_own_output(made, tmp_path, capsys):
    """The guard is not a refusal of everything: a writer reruns over its own output."""
    victims = tmp_path / "victims"
    shutil.copytree(made / "victims", victims)
    src = made / "sources"
    for writer, target in [("preprocess", "corpus"), ("merge", "m_text_document"),
                           ("config", "job.toml"), ("convert", "hf")]:  # fmt: skip
        assert _write(writer, victims / target, src) == 0, capsys.readouterr().err


def test_save_state_refuses_a_train_runs_checkpoints(made, tmp_path):
    """accelerator.save_state on an epochal train run's folders: refused before writing."""
    import transformers
    from torch.utils.data import DataLoader
    from transformers import default_data_collator

    from epochal.accelerate import Accelerator

    victims = tmp_path / "victims"
    shutil.copytree(made / "victims", victims)
    before = _snapshot(victims)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=8)
    data = [{"input_ids": torch.arange(8) % 50, "labels": torch.arange(8) % 50} for _ in range(4)]
    loader = DataLoader(data, batch_size=2, collate_fn=default_data_collator)
    accelerator = Accelerator()
    accelerator.prepare(transformers.GPT2LMHeadModel(config), loader)
    for target in ("run/checkpoints", "run", "run/checkpoints/step_0000002"):
        with pytest.raises(ValueError, match="epochal train run") as exc:
            accelerator.save_state(victims / target)
        assert str(victims / target) in str(exc.value)
    assert _snapshot(victims) == before
    # its own folder is written, and written again
    accelerator.save_state(tmp_path / "state")
    accelerator.save_state(tmp_path / "state")
    assert (tmp_path / "state" / "latest").is_file()
    # the run still trains on: epochal train accepts its own directory
    assert (
        cli_main(["train", f"--run_dir={victims / 'run'}", *TINY, "--training.train_iters=3"]) == 0
    )


@pytest.mark.parametrize("mode", ["defaults", "interactive", "accelerate"])
def test_config_never_replaces_a_file_it_did_not_write(tmp_path, capsys, monkeypatch, mode):
    script = tmp_path / "train.py"
    script.write_text("print('my training script')\n")
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "")
    flags = {"defaults": ["--defaults"], "interactive": [], "accelerate": ["--accelerate"]}[mode]
    assert cli_main(["config", *flags, "-o", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"--output {script} already exists and epochal config did not write it" in err
    assert "--overwrite" in err and asked == []  # refused before the first question
    assert script.read_text() == "print('my training script')\n"
    # --overwrite replaces it; then the file is the command's own and is replaced on a rerun
    assert cli_main(["config", *flags, "-o", str(script), "--overwrite"]) == 0
    assert "my training script" not in script.read_text()
    assert cli_main(["config", *flags, "-o", str(script)]) == 0


def test_run_dir_naming_a_file_says_so(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("mine\n")
    assert cli_main(["train", f"--run_dir={path}", *TINY, "--training.train_iters=1"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir: {path} is a file, not a directory" in err and "--run_dir=DIR" in err
    assert "Errno" not in err and path.read_text() == "mine\n"


def test_the_trainer_itself_refuses_a_run_dir_inside_a_checkpoint(made, tmp_path):
    """Library use (Trainer(config).train()) is refused too, before anything is written."""
    from epochal.model import ConfigError
    from epochal.train import Trainer, build_config

    victims = tmp_path / "victims"
    shutil.copytree(made / "victims", victims)
    before = _snapshot(victims)
    inside = victims / "run" / "checkpoints" / "step_0000002"
    config = build_config(preset="tiny", overrides=[f"--run_dir={inside}", *TINY])
    with pytest.raises(ConfigError, match="a checkpoint of the epochal train run") as exc:
        Trainer(config).train()
    assert str(inside) in str(exc.value)
    assert _snapshot(victims) == before
