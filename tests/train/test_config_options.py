"""The option reference (``describe_options``), ``--list-options``, ``--help`` and the suggestions for mistyped options."""

from __future__ import annotations

import pytest

from epochal.cli import main as cli_main
from epochal.model.config import ConfigError
from epochal.train.config import TrainConfig, build_config, describe_options
from epochal.train.config.flags import BIONEMO_FLAGS, MEGATRON_FLAGS
from epochal.train.config.options import attribute_docs, first_sentence
from epochal.train.config.presets import PRESET_SUMMARIES, PRESETS
from epochal.train.config.run_name import flat_options


def test_every_option_is_described():
    options = describe_options()
    assert [o.name for o in options] == list(flat_options(TrainConfig()))
    missing = [o.name for o in options if not o.description.strip()]
    assert not missing, f"options without a description in their class docstring: {missing}"
    by_name = {o.name: o for o in options}
    assert by_name["training.train_iters"].type == "int"
    assert by_name["training.device"].type == "auto|cpu|cuda"
    assert by_name["logging.profile_steps"].type == "list[int] | None"
    assert by_name["training.micro_batch_size"].megatron == "--micro-batch-size"
    assert by_name["data.train_cluster_path"].bionemo == "--train-cluster-path"
    # the values of a configuration, for `--preset X --list-options`
    bert = {o.name: o for o in describe_options("model", build_config(preset="bert-tiny"))}
    assert bert["model.type"].default == "bert" and "training.seed" not in bert


def test_peer_flags_name_real_options():
    options = flat_options(TrainConfig())
    for table in (MEGATRON_FLAGS, BIONEMO_FLAGS):
        assert set(table) <= set(options), set(table) - set(options)
        assert all(flag.startswith("--") for flag in table.values())


def test_docstring_entries_and_sentences():
    class Section:
        """A section.

        Attributes:
            a / b: shared text
                continued.
            c: one; two.
        Not an entry: ignored.
        """

    assert attribute_docs(Section) == {
        "a": "shared text continued.",
        "b": "shared text continued.",
        "c": "one; two.",
    }
    assert first_sentence("x (a; b) e.g. y. z") == "x (a; b) e.g. y"


@pytest.mark.parametrize(
    ("override", "suggested"),
    [
        ("--training.train_iter=5", "did you mean training.train_iters?"),
        ("--train_iters=5", "did you mean training.train_iters?"),
        ("--trainng.seed=1", "did you mean training?"),
        ("--model.hidden_sze=8", "did you mean model.hidden_size?"),
        ("--optimizer.learning_rate=1", "epochal train --list-options optimizer lists"),
    ],
)
def test_an_unknown_option_suggests_the_closest(override, suggested, capsys):
    with pytest.raises(ConfigError) as info:
        build_config(preset="tiny", overrides=[override])
    assert suggested in str(info.value)
    assert "known:" not in str(info.value)  # no list of every option
    assert cli_main(["train", override]) == 2
    assert suggested in capsys.readouterr().err


def test_unknown_flags_suggest_too(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--print_config"])
    assert "did you mean --print-config?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["train", "--training.train_iters", "5"])
    assert "--training.train_iters=VALUE" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="did you mean bert-tiny"):
        build_config(preset="bert")


def test_help_lists_every_preset_and_how_to_list_options(capsys):
    assert set(PRESET_SUMMARIES) == set(PRESETS)
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    out = capsys.readouterr().out
    for name, summary in PRESET_SUMMARIES.items():
        assert f"  {name}" in out and summary in out
    assert "--list-options [SECTION]" in out and "runs/<preset>" in out


def test_list_options(capsys):
    assert cli_main(["train", "--list-options", "training"]) == 0
    out = capsys.readouterr().out
    assert "[training]" in out and "training.train_iters = 300  (int)" in out
    assert "[Megatron --train-iters; BioNeMo --num-steps]" in out and "[model]" not in out
    assert cli_main(["train", "--preset", "esm-tiny", "--list-options"]) == 0
    out = capsys.readouterr().out
    assert 'model.type = "esm"' in out and "[finetune]" in out and "run_dir" in out
    assert cli_main(["train", "--list-options", "trainin"]) == 2
    assert "did you mean training?" in capsys.readouterr().err
