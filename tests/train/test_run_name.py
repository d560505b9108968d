"""Default run directories: named after the run, so that commands do not land in each other's runs."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from epochal.cli import main as cli_main
from epochal.train.config import TrainConfig, build_config
from epochal.train.config.presets import PRESETS
from epochal.train.config.run_name import NOT_RUN_DEFINING, defines_run, flat_options
from epochal.train.state.run_dir import RUN_DEFINING


def _dir(preset="tiny", *overrides, config_file=None):
    return build_config(
        preset=preset, config_file=config_file, overrides=list(overrides), require_data=False
    ).run_dir


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_as_it_is_trains_in_runs_preset(preset):
    assert _dir(preset) == f"runs/{preset}"
    # options that do not define the run keep the name: the same command resumes, and a
    # larger train_iters continues it
    assert _dir(preset, "--training.train_iters=7", "--logging.log_interval=3") == f"runs/{preset}"


def test_options_that_define_the_run_get_a_name_of_their_own():
    keep = [
        "--training.train_iters=5",
        "--training.eval_interval=2",
        "--training.eval_iters=1",
        "--training.device=cpu",
        "--training.exit_interval=3",
        "--checkpoint.save_interval=1",
        "--checkpoint.keep_last=5",
        "--logging.progress=false",
        "--logging.tensorboard=false",
        "--data.num_workers=2",
        "--model.hidden_size=128",  # the preset's own value: the same run
    ]
    assert _dir("tiny", *keep) == "runs/tiny"
    names = {
        _dir("tiny", option)
        for option in (
            "--model.hidden_size=64",
            "--training.seed=7",
            "--optimizer.lr=1e-3",
            "--data.seq_length=64",
            "--training.bf16=true",
            "--parallel.tensor_parallel=2",
            "--parallel.data_parallel=2",
        )
    }
    assert len(names) == 7 and all(n.startswith("runs/tiny-") and len(n) == 18 for n in names)
    # the same options (in any order, with any non-defining ones) give the same name
    a = _dir("tiny", "--model.hidden_size=64", "--training.seed=7")
    assert a == _dir(
        "tiny", "--training.seed=7", "--training.train_iters=9", "--model.hidden_size=64"
    )
    assert a != _dir("tiny", "--model.hidden_size=64", "--training.seed=8")
    # an explicit run_dir wins
    assert _dir("tiny", "--model.hidden_size=64", "--run_dir=mine") == "mine"


def test_a_config_file_names_its_run(tmp_path, capsys):
    assert cli_main(["train", "--preset", "esm-tiny", "--print-config"]) == 0
    job = tmp_path / "job.toml"
    job.write_text(capsys.readouterr().out)
    assert job.read_text().startswith('# run_dir = "runs/esm-tiny"')  # derived: not pinned
    assert tomllib.loads(job.read_text()).get("run_dir") is None
    assert _dir(None, config_file=job) == "runs/job"
    assert _dir(None, "--training.train_iters=9", config_file=job) == "runs/job"
    hashed = _dir(None, "--model.num_layers=1", config_file=job)
    assert hashed.startswith("runs/job-") and hashed != "runs/job"
    # a run_dir set explicitly is printed as it is
    assert cli_main(["train", "--print-config", "--run_dir=runs/x"]) == 0
    assert capsys.readouterr().out.startswith('run_dir = "runs/x"')


def test_every_option_that_cannot_change_on_resume_is_part_of_the_name():
    """What refuses a resume must also change the default name, or a new command would be refused."""
    options = flat_options(TrainConfig())
    for section, keys in RUN_DEFINING.items():
        for key in keys or [o.split(".", 1)[1] for o in options if o.startswith(section + ".")]:
            assert defines_run(f"{section}.{key}"), f"{section}.{key}"
    assert all(defines_run(o) for o in options if o.startswith("model."))


def test_the_options_that_keep_the_name_exist():
    options = flat_options(TrainConfig())
    for section, keys in NOT_RUN_DEFINING.items():
        for key in keys:
            assert (f"{section}.{key}" if section else key) in options, (section, key)
    assert not defines_run("run_dir") and not defines_run("training.train_iters")
    assert defines_run("checkpoint.init_from") and defines_run("parallel.tensor_parallel")
    assert {f.name for f in dataclasses.fields(TrainConfig)} >= set(NOT_RUN_DEFINING) - {""}


@pytest.mark.parametrize(
    "switch", ["--training.memory_check=false", "--training.deterministic_kernels=true"]
)
def test_check_switches_keep_the_run_name(switch):
    """A switch that only checks (memory_check) or pins GPU kernels does not start another run."""
    assert _dir("tiny", switch) == "runs/tiny"
    assert _dir("tiny", "--training.seed=7", switch) == _dir("tiny", "--training.seed=7")
    assert not defines_run(switch.removeprefix("--").partition("=")[0])
