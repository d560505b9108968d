"""``epochal --help``: every subcommand is registered, importable, and described as it is."""

from __future__ import annotations

import importlib

import pytest

from epochal.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_module_has_the_interface(name):
    module = importlib.import_module(SUBCOMMANDS[name][0])
    assert callable(module.add_arguments) and callable(module.run)
    assert module.__name__.startswith("epochal.commands.")


def test_help_describes_each_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in SUBCOMMANDS:
        assert name in out
    # train covers every model type it trains; convert every family and Megatron format
    assert "GPT (Llama-style), BERT, ESM-2 or T5" in out
    for family in ("GPT-2", "Llama", "BERT", "ESM-2", "T5", "torch_dist", "NeMo 2"):
        assert family in out.split("convert", 1)[1]
    assert "``" not in out
