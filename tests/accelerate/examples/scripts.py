"""Hugging Face Accelerate's and transformers' example scripts, run unmodified but for the imports.

The scripts are not part of this repository: they are read from
``EPOCHAL_UPSTREAM_EXAMPLES`` (default ``~/.cache/epochal/upstream-examples``), a folder
holding ``accelerate/examples/...`` from huggingface/accelerate at :data:`ACCELERATE_COMMIT`
and ``transformers/examples/pytorch/language-modeling/run_{clm,mlm}_no_trainer.py`` as
of transformers 4.57 (each file is checked against its SHA-256 below, so a different version is not run
by mistake). The tests skip without them.

:func:`epochal_text` applies the one change a user makes (``from accelerate...`` ->
``from epochal.accelerate...``) to the unmodified text at run time; every run gets the
offline stand-ins of ``shim/`` (tiny models, offline tokenizer and data, see
``shim/stand_ins.py``) and runs on the CPU with one thread per process.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import epochal
from tests.dist_utils import run_process

HERE = Path(__file__).resolve().parent
SRC = Path(epochal.__file__).resolve().parent.parent
ACCELERATE_COMMIT = "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83"


@dataclass(frozen=True)
class Script:
    """One example script: where it lives upstream, its digest, the arguments of a tiny run."""

    path: str
    sha256: str
    args: tuple[str, ...] = ()
    #: ``EPOCHAL_EXAMPLE_ROWS`` (train,validation rows of the stand-in data)
    rows: str = "64,64"
    #: a line of the output that shows the run reached its end (a regex)
    done: str = ""
    #: the regex whose first group is the evaluation loss (language models)
    eval_loss: str | None = None
    env: dict[str, str] = field(default_factory=dict)


_A = "accelerate/examples/"
_T = "transformers/examples/pytorch/language-modeling/"
_CLASSIFY_DONE = r"epoch 2: \{'accuracy': [0-9.]+, 'f1': [0-9.]+\}"

SCRIPTS = {
    "nlp_example": Script(
        _A + "nlp_example.py",
        "199f1d6d2b38bf2bb5b6904fa6f93418d0dce715bb9be53ecb8f90699160f0d9",
        ("--cpu",),
        done=_CLASSIFY_DONE,
    ),
    "complete_nlp_example": Script(
        _A + "complete_nlp_example.py",
        "5e76c87dd371004accde3b544f27ea0c55be8efd1e6ac5e904b9e063a948d1e5",
        ("--cpu", "--checkpointing_steps", "epoch", "--output_dir", "out"),
        done=_CLASSIFY_DONE,
    ),
    "checkpointing": Script(
        _A + "by_feature/checkpointing.py",
        "f0923cb0e95de00d58c6b43fe8eefa37170e6f7e509ba4593417c0ed6c63d6e6",
        ("--cpu", "--checkpointing_steps", "epoch", "--output_dir", "out"),
        done=_CLASSIFY_DONE,
    ),
    "gradient_accumulation": Script(
        _A + "by_feature/gradient_accumulation.py",
        "b7fb15066d3953d1583e82abff1c14103810658aad5b1412422322d88c0c69d6",
        ("--cpu", "--gradient_accumulation_steps", "2"),
        done=_CLASSIFY_DONE,
    ),
    "local_sgd": Script(
        _A + "by_feature/local_sgd.py",
        "683186d8d415d78bd59fc0651e0637fe03f50c8220803f369c43906070fdee94",
        ("--cpu", "--local_sgd_steps", "4"),
        done=_CLASSIFY_DONE,
    ),
    "tracking": Script(
        _A + "by_feature/tracking.py",
        "b53b5c1e0e186d5a1b71bcea5ae0520f7a1afe996e5fc306edff8c45ed177b5b",
        ("--cpu", "--with_tracking", "--project_dir", "logs"),
        done=_CLASSIFY_DONE,
    ),
    "memory": Script(
        _A + "by_feature/memory.py",
        "b45d0d037379bca85b72fb424e2213efa9076dc3cbf202891c7e33dadfcec7a7",
        ("--cpu",),
        done=_CLASSIFY_DONE,
    ),
    "gradient_accumulation_for_autoregressive_models": Script(
        _A + "by_feature/gradient_accumulation_for_autoregressive_models.py",
        "61a8680c477a1f015ffb69c4d4169b50208449aea159eb97bddf1ea97ed08133",
        ("--cpu", "--per_device_batch_size", "25"),
        rows="480,64",
        done=r"epoch 2:: eval perplexity",
        eval_loss=r"epoch 2:: eval perplexity: \S+ eval_loss: ([0-9.]+)",
    ),
    "run_clm_no_trainer": Script(
        _T + "run_clm_no_trainer.py",
        "6491cd60ef74eb77dc86e1e13668b8312894b7bb6da0a25281c82bf34d9ed9ec",
        (
            "--dataset_name",
            "wikitext",
            "--dataset_config_name",
            "wikitext-2-raw-v1",
            "--model_name_or_path",
            "gpt2",
            "--block_size",
            "32",
            "--learning_rate",
            "1e-3",
            "--per_device_train_batch_size",
            "4",
            "--per_device_eval_batch_size",
            "4",
            "--num_train_epochs",
            "1",
            "--seed",
            "42",
            "--output_dir",
            "out",
        ),  # fmt: skip
        done=r"epoch 0: perplexity",
        eval_loss=r"epoch 0: perplexity: \S+ eval_loss: ([0-9.]+)",
    ),
    "run_mlm_no_trainer": Script(
        _T + "run_mlm_no_trainer.py",
        "52200e1f460202050d3e32e2ab006967ceed1d647811e50e976df9425b2290f1",
        (
            "--dataset_name",
            "wikitext",
            "--dataset_config_name",
            "wikitext-2-raw-v1",
            "--model_name_or_path",
            "bert-base-cased",
            "--max_seq_length",
            "32",
            "--learning_rate",
            "1e-3",
            "--per_device_train_batch_size",
            "4",
            "--per_device_eval_batch_size",
            "4",
            "--num_train_epochs",
            "1",
            "--seed",
            "42",
            "--output_dir",
            "out",
        ),  # fmt: skip
        done=r"epoch 0: perplexity",
        eval_loss=r"epoch 0: perplexity: \S+ eval_loss: ([0-9.]+)",
    ),
}


def root() -> Path:
    """The folder the upstream scripts are read from."""
    default = Path.home() / ".cache" / "epochal" / "upstream-examples"
    return Path(os.environ.get("EPOCHAL_UPSTREAM_EXAMPLES", default))


def source(name: str) -> str | None:
    """The unmodified text of script ``name``; None when it is not there.

    Raises:
        AssertionError: the file is there but is another version (its SHA-256 differs).
    """
    import hashlib

    script = SCRIPTS[name]
    path = root() / script.path
    if not path.is_file():
        return None
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == script.sha256, f"{path}: another version (sha256 {digest})"
    return data.decode()


_IMPORT = re.compile(r"^(\s*)(from|import) accelerate(\.|\s)", re.MULTILINE)


def epochal_text(text: str) -> str:
    """``text`` with ``from accelerate...`` / ``import accelerate...`` on ``epochal.accelerate``."""
    changed, count = _IMPORT.subn(r"\1\2 epochal.accelerate\3", text)
    assert count >= 1, "no accelerate import to change"
    before, after = text.splitlines(), changed.splitlines()
    assert len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        assert old == new or new == _IMPORT.sub(r"\1\2 epochal.accelerate\3", old)
    return changed


#: the layouts every script runs in: None = one process, else an Accelerate config file
LAYOUTS = {
    "one": None,
    "tp2": "megatron_lm_tp_degree: 2",
    "dp2": "megatron_lm_tp_degree: 1",
}


def _yaml(folder: Path, layout: str) -> Path:
    path = folder / f"{layout}.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\n"
        "distributed_type: MEGATRON_LM\n"
        "machine_rank: 0\n"
        "main_process_ip: null\n"
        "main_process_port: null\n"
        "megatron_lm_config:\n"
        "  megatron_lm_gradient_clipping: 1.0\n"
        "  megatron_lm_num_micro_batches: 1\n"
        "  megatron_lm_pp_degree: 1\n"
        f"  {LAYOUTS[layout]}\n"
        "mixed_precision: 'no'\n"
        "num_machines: 1\n"
        "num_processes: 2\n"
        "rdzv_backend: static\n"
        "same_network: true\n"
        "use_cpu: true\n"
    )
    return path


def environment(script: Script) -> dict[str, str]:
    """The environment of a run: offline stand-ins, one thread, no inherited launcher variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "MEGATRON_LM_", "EPOCHAL_EXAMPLE_"))
    }
    path = [str(HERE / "shim"), str(SRC), env.get("PYTHONPATH", "")]
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in path if p),
        EPOCHAL_EXAMPLE_STAND_INS="1",
        EPOCHAL_EXAMPLE_ROWS=script.rows,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="offline",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        **script.env,
    )
    return env


def run(
    name: str,
    layout: str,
    folder: Path,
    *,
    peer: bool = False,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] | None = None,
    timeout: float = 600,
):
    """Run script ``name`` in ``folder``: epochal's text (or, ``peer``, the unmodified one).

    ``layout`` is ``"one"`` (``python script.py``) or a key of :data:`LAYOUTS`
    (``epochal launch --config_file`` that layout). The peer runs in one process;
    ``env`` is added to the run's environment (e.g. ``MEGATRON_LM_NUM_MICRO_BATCHES``);
    ``args`` replace the script's arguments.
    Returns the ``subprocess.CompletedProcess`` (stdout and stderr as text).
    """
    script = SCRIPTS[name]
    text = source(name)
    assert text is not None, f"{root() / script.path} is missing"
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / Path(script.path).name
    file.write_text(text if peer else epochal_text(text))
    argv = script.args if args is None else args
    if layout == "one":
        cmd = [sys.executable, str(file), *argv]
    else:
        assert not peer, "the reference runs in one process"
        launch = [sys.executable, "-m", "epochal.cli", "launch"]
        cmd = [*launch, "--config_file", str(_yaml(folder, layout)), str(file), *argv]
    return run_process(
        cmd, env={**environment(script), **(env or {})}, timeout=timeout, cwd=str(folder)
    )


def eval_loss(name: str, output: str) -> float:
    """The last evaluation loss script ``name`` printed."""
    found = re.findall(SCRIPTS[name].eval_loss, output)
    assert found, output[-3000:]
    return float(found[-1])
