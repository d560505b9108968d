"""Process counts bounded by what the machine runs: the wizard, ``epochal train`` and ``epochal launch`` alike."""

from __future__ import annotations

import os

import pytest

from epochal.cli import main as cli_main
from epochal.model.config import ConfigError
from epochal.parallel.launch import check_launchable, local_process_limit
from tests.train.test_cli_config_errors import no_launch as _no_launch  # noqa: F401 - a fixture
from tests.train.test_run_dir import TINY

HUGE = 10**100 - 1


def test_train_and_launch_share_one_bound_on_the_cpu():
    from epochal.accelerate.yaml_config import LaunchConfig
    from epochal.commands.launch import process_bound

    cores = len(os.sched_getaffinity(0))
    limit, why = local_process_limit("cpu")
    assert limit == 4 * cores and "4 per CPU core" in why
    assert process_bound(LaunchConfig(use_cpu=True))[0] == limit  # epochal launch's
    # gloo ranks may share a GPU: the CPU bound applies on CUDA too
    assert local_process_limit("cuda", "gloo") == (limit, why)
    assert local_process_limit("cpu", oversubscribe=True)[0] is None
    check_launchable(limit, "cpu", option="parallel.data_parallel")
    with pytest.raises(ConfigError, match=r"parallel\.data_parallel.*10\^99 processes"):
        check_launchable(HUGE, "cpu", option="parallel.data_parallel")
    check_launchable(HUGE, "cpu", option="parallel.data_parallel", oversubscribe=True)


def test_epochal_train_launches_up_to_the_bound_and_oversubscribe_goes_past(
    tmp_path, capsys, request
):
    launched = request.getfixturevalue("_no_launch")
    bound = 4 * len(os.sched_getaffinity(0))

    def train(processes: int, *flags: str) -> int:
        return cli_main(
            [
                "train",
                *flags,
                f"--run_dir={tmp_path / str(processes)}",
                *TINY,
                "--training.micro_batch_size=1",
                f"--training.global_batch_size={processes}",
                f"--parallel.data_parallel={processes}",
            ]
        )

    assert train(bound) == 1 and len(launched) == 1, capsys.readouterr().err  # relaunch stub: 1
    assert train(bound + 1) == 2 and len(launched) == 1
    err = capsys.readouterr().err
    assert f"parallel.data_parallel: asks for {bound + 1} processes" in err
    assert f"at most {bound} (4 per CPU core" in err and "epochal train --oversubscribe" in err
    assert train(bound + 1, "--oversubscribe") == 1 and len(launched) == 2


def test_wizard_reasks_a_data_parallel_size_the_machine_cannot_launch(monkeypatch):
    from epochal.commands.config import collect

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # bound by CPU cores, as on CI

    replies = iter(["", "1", "1", "1", str(HUGE), "1", "", "", "", "", "", "mock", ""])
    prompts: list[str] = []
    shown: list[str] = []

    def read(prompt: str) -> str:
        prompts.append(prompt)
        return next(replies)

    import builtins

    real_print = builtins.print
    builtins.print = lambda *a, **k: shown.append(" ".join(map(str, a)))
    try:
        answers = collect(read)
    finally:
        builtins.print = real_print
    assert answers["data_parallel"] == 1
    assert prompts.count("Data parallel size (model replicas) [1]: ") == 2
    (reason,) = [s for s in shown if "invalid" in s]
    assert "parallel.data_parallel" in reason and "CPU core" in reason


@pytest.mark.parametrize(
    ("override", "option"),
    [
        (  # a layout that is consistent (the global batch fits), only too large to launch
            f"--parallel.data_parallel={HUGE} --training.micro_batch_size=1 "
            f"--training.global_batch_size={HUGE}",
            "parallel.data_parallel",
        ),
        (
            "--parallel.nproc_per_node=100000 --training.micro_batch_size=1 "
            "--training.global_batch_size=100000",
            "parallel.nproc_per_node",
        ),
    ],
)
def test_epochal_train_refuses_to_launch_absurd_world_sizes(
    tmp_path,
    capsys,
    request,
    override,
    option,
):
    launched = request.getfixturevalue("_no_launch")
    rc = cli_main(
        ["train", f"--run_dir={tmp_path}", *TINY, "--training.device=cpu", *override.split()]
    )
    err = capsys.readouterr().err
    assert rc == 2 and launched == [], err
    assert option in err and "CPU core" in err
