"""Accelerate's YAML, ``epochal config --accelerate`` and ``epochal launch``: what they refuse before a run."""

import builtins

import pytest

from epochal.accelerate.plugin import MegatronLMPlugin, PluginError
from epochal.accelerate.yaml_config import YamlConfigError, read_launch_config
from epochal.cli import main


def test_a_key_given_twice_is_refused_naming_the_key_and_its_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text(
        "distributed_type: MEGATRON_LM\nnum_processes: 2\nmegatron_lm_config:\n"
        "  megatron_lm_tp_degree: 2\n  megatron_lm_tp_degree: 1\nnum_processes: 4\n"
    )
    with pytest.raises(YamlConfigError) as err:
        read_launch_config(path)
    text = str(err.value)
    assert str(path) in text
    assert "num_processes" in text and "lines 2, 6" in text
    path.write_text("megatron_lm_config:\n  megatron_lm_tp_degree: 2\n  megatron_lm_tp_degree: 1\n")
    with pytest.raises(
        YamlConfigError, match=r"megatron_lm_config\.megatron_lm_tp_degree.*lines 2, 3"
    ):
        read_launch_config(path)
    # the same key in two different mappings is fine
    path.write_text("a_list:\n  - {x: 1}\n  - {x: 2}\n")
    with pytest.raises(YamlConfigError, match="unknown key 'a_list'"):
        read_launch_config(path)


@pytest.mark.parametrize(
    "key,value,allowed",
    [
        ("megatron_lm_gradient_clipping", ".nan", "finite number >= 0"),
        ("megatron_lm_gradient_clipping", "-1.0", "finite number >= 0"),
        ("megatron_lm_gradient_clipping", ".inf", "finite number >= 0"),
        ("megatron_lm_recompute_granularity", "bogus", "none, full, selective"),
        ("megatron_lm_recompute_method", "every", "uniform, block"),
        ("megatron_lm_tp_degree", "0", "integer >= 1"),
    ],
)
def test_yaml_values_are_checked_at_launch_before_any_process(
    tmp_path, capsys, key, value, allowed
):
    path = tmp_path / "bad.yaml"
    path.write_text(f"distributed_type: MEGATRON_LM\nmegatron_lm_config:\n  {key}: {value}\n")
    with pytest.raises(YamlConfigError) as err:
        read_launch_config(path)
    for part in (str(path), key, allowed):
        assert part in str(err.value)
    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert main(["launch", "--config_file", str(path), str(script)]) == 2
    message = capsys.readouterr().err
    assert str(path) in message and key in message and allowed in message
    assert not marker.exists()


def test_launch_flags_and_the_environment_are_checked_too(tmp_path, capsys, monkeypatch):
    script = tmp_path / "script.py"
    script.write_text("raise SystemExit(7)\n")
    flag = ["--megatron_lm_gradient_clipping", "nan"]
    assert main(["launch", *flag, str(script)]) == 2
    assert "megatron_lm_gradient_clipping=nan" in capsys.readouterr().err
    monkeypatch.setenv("MEGATRON_LM_RECOMPUTE_GRANULARITY", "bogus")
    with pytest.raises(PluginError, match="MEGATRON_LM_RECOMPUTE_GRANULARITY='bogus'.*selective"):
        MegatronLMPlugin()
    monkeypatch.delenv("MEGATRON_LM_RECOMPUTE_GRANULARITY")
    monkeypatch.setenv("MEGATRON_LM_GRADIENT_CLIPPING", "nan")
    with pytest.raises(PluginError, match="MEGATRON_LM_GRADIENT_CLIPPING='nan'.*finite"):
        MegatronLMPlugin()


def test_launch_refuses_more_cpu_processes_than_the_machine_runs(tmp_path, capsys):
    from epochal.commands.launch import PROCESSES_PER_CPU, _cpu_count

    marker = tmp_path / "ran"
    script = tmp_path / "script.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    bound = PROCESSES_PER_CPU * _cpu_count()
    assert main(["launch", "--num_processes", str(bound + 1), "--cpu", str(script)]) == 2
    message = capsys.readouterr().err
    assert f"--num_processes={bound + 1}" in message and f"at most {bound}" in message
    assert "--oversubscribe" in message
    yaml = tmp_path / "many.yaml"
    yaml.write_text(f"num_processes: {bound + 1}\nuse_cpu: true\n")
    assert main(["launch", "--config_file", str(yaml), str(script)]) == 2
    assert f"num_processes in {yaml}" in capsys.readouterr().err
    assert not marker.exists()


# every question answered: two machines, TP2 x PP2 x DP4, ...
FLAGS = [
    "--num_machines", "2", "--machine_rank", "1", "--main_process_ip", "10.0.0.1",
    "--main_process_port", "29501", "--tp", "2", "--sequence_parallelism", "--pp", "2",
    "--num_processes", "16", "--num_micro_batches", "4", "--recompute_activations", "no",
    "--use_distributed_optimizer", "--gradient_clipping", "0.5", "--mixed_precision", "bf16",
    "--cpu",
]  # fmt: skip
ANSWERS = [
    "2",
    "1",
    "10.0.0.1",
    "29501",
    "2",
    "yes",
    "2",
    "4",
    "4",
    "no",
    "yes",
    "0.5",
    "bf16",
    "yes",
]


def test_config_flags_write_the_file_the_same_answers_typed_in_give(tmp_path, monkeypatch):
    typed = iter(ANSWERS)
    prompts = []
    monkeypatch.setattr(builtins, "input", lambda prompt: prompts.append(prompt) or next(typed))
    assert main(["config", "--accelerate", "-o", str(tmp_path / "typed.yaml")]) == 0
    assert len(prompts) == len(ANSWERS)

    def no_question(prompt):
        raise AssertionError(f"asked {prompt!r}")

    monkeypatch.setattr(builtins, "input", no_question)
    assert main(["config", "--accelerate", "-o", str(tmp_path / "flags.yaml"), *FLAGS]) == 0
    assert (tmp_path / "flags.yaml").read_text() == (tmp_path / "typed.yaml").read_text()
    spec = read_launch_config(tmp_path / "flags.yaml")
    assert (spec.num_processes, spec.megatron["megatron_lm_pp_degree"]) == (16, 2)
    # a few flags and --defaults: the rest take their defaults, nothing is asked
    short = ["--tp", "2", "--num_processes", "4", "--cpu", "--defaults"]
    assert main(["config", "--accelerate", "-o", str(tmp_path / "short.yaml"), *short]) == 0
    typed = iter(["", "2", "", "", "2", "", "", "", "", "", "yes"])
    monkeypatch.setattr(builtins, "input", lambda prompt: next(typed))
    assert main(["config", "--accelerate", "-o", str(tmp_path / "short_typed.yaml")]) == 0
    assert (tmp_path / "short.yaml").read_text() == (tmp_path / "short_typed.yaml").read_text()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--sequence_parallelism"], "--sequence_parallelism applies only with --tp > 1"),
        (["--machine_rank", "1"], "--machine_rank applies only with --num_machines > 1"),
        (["--tp", "2", "--num_processes", "3"], "--num_processes=3 is not a multiple"),
        (["--gradient_clipping", "inf"], "--gradient_clipping inf"),
        (["--dp", "2", "--num_processes", "2"], "--dp or --num_processes"),
    ],
)
def test_config_flags_that_do_not_fit_are_refused(tmp_path, capsys, flags, message):
    out = tmp_path / "x.yaml"
    assert main(["config", "--accelerate", "--defaults", "-o", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_on_gpus_the_bound_is_one_process_per_visible_gpu(monkeypatch):
    import torch

    from epochal.accelerate.yaml_config import LaunchConfig
    from epochal.commands.launch import process_bound

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert process_bound(LaunchConfig(num_processes=4))[0] == 2
    assert process_bound(LaunchConfig(num_processes=4), oversubscribe=True)[0] == 2
    assert process_bound(LaunchConfig(gpu_ids="1"))[0] == 1
    cpu = process_bound(LaunchConfig(use_cpu=True))
    assert cpu is not None and "CPU core" in cpu[1]
    assert process_bound(LaunchConfig(use_cpu=True), oversubscribe=True) is None
