"""`epochal train` configuration errors a new user meets (issue 15, items 3, 5, 6, 7, 8).

Each is caught before anything is launched, prepared or trained, printed once as
``epochal train: error: <option or file>: ...`` (no traceback) with exit status 2.
"""

from __future__ import annotations

import tomllib

import pytest

from epochal.cli import main as cli_main
from epochal.model import ConfigError
from epochal.train.config import build_config
from epochal.train.config.presets import PRESETS

SMALL = [
    "--training.device=cpu",  # compared with CPU references: the same with or without a GPU
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=2",
    "--model.ffn_hidden_size=64",
    "--data.seq_length=32",
    "--training.micro_batch_size=2",
    "--training.global_batch_size=4",
    "--training.train_iters=2",
    "--training.eval_iters=0",
    "--logging.progress=false",
    "--logging.tensorboard=false",
]


@pytest.fixture
def no_launch(monkeypatch):
    """Record (instead of run) any torchrun launch; no launcher environment."""
    import epochal.parallel.launch as launch

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "EPOCHAL_RELAUNCHED"):
        monkeypatch.delenv(name, raising=False)
    calls = []
    monkeypatch.setattr(launch, "relaunch", lambda config, argv, **kw: calls.append(argv) or 1)
    return calls


# ------------------------------------------------------------ item 3: data path
def test_explicit_data_path_replaces_the_presets_corpus():
    cfg = build_config(preset="tiny", overrides=["--data.data_path=['/data/x']"])
    assert cfg.data.data_path == ["/data/x"] and cfg.data.corpus == ""
    cfg = build_config(preset="tiny", overrides=["--data.mock=true"])
    assert cfg.data.mock and cfg.data.corpus == ""
    cfg = build_config(preset="tiny", overrides=["--data.train_data_path=['/t']"])
    assert cfg.data.train_data_path == ["/t"] and cfg.data.corpus == ""


def test_two_explicit_data_sources_name_both(tmp_path):
    with pytest.raises(ConfigError) as info:
        build_config(
            preset="tiny", overrides=["--data.corpus=stdlib", "--data.data_path=['/data/x']"]
        )
    assert info.value.option == "data.corpus" and "data.data_path" in str(info.value)
    f = tmp_path / "c.toml"
    f.write_text('[data]\ncorpus = "stdlib"\nmock = true\n')
    with pytest.raises(ConfigError, match=r"data\.corpus.*data\.mock"):
        build_config(config_file=f)


def test_missing_prefix_is_an_error_before_training(tmp_path, capsys, no_launch):
    run = tmp_path / "run"
    missing = tmp_path / "no" / "such_prefix"
    rc = cli_main(["train", f"--data.data_path=['{missing}']", f"--run_dir={run}", *SMALL])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"data.data_path: {missing}.idx does not exist" in err
    assert "Traceback" not in err and not run.exists()


# ------------------------------------------------------------ item 5: --config
@pytest.mark.parametrize("kind", ["binary", "directory"])
def test_unreadable_config_file_is_named(tmp_path, capsys, kind):
    path = tmp_path / "model.bin"
    if kind == "binary":
        path.write_bytes(b"\x00\x01PK\x03\x04\xff\xfe" * 64)
    else:
        path.mkdir()
    assert cli_main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"epochal train: error: {path}: ") and "Traceback" not in err
    assert err.count("\n") == 1
    with pytest.raises(ConfigError) as info:
        build_config(config_file=path)
    assert info.value.option == str(path)


# ------------------------------------------------------------ item 6: layout
@pytest.mark.parametrize(
    ("override", "option"),
    [
        ("--parallel.tensor_parallel=3", "parallel.tensor_parallel"),  # 4 heads
        ("--parallel.pipeline_parallel=3", "model.num_layers"),  # 2 layers over 3 stages
        ("--parallel.data_parallel=3", "training.global_batch_size"),  # 4 % (2 * 3)
    ],
)
def test_layout_is_checked_once_before_launching(tmp_path, capsys, no_launch, override, option):
    rc = cli_main(["train", "--data.mock=true", override, f"--run_dir={tmp_path / 'r'}", *SMALL])
    out, err = capsys.readouterr()
    assert rc == 2 and no_launch == [], out + err
    assert err.count("epochal train: error: ") == 1 and f"error: {option}" in err, err
    assert "launching" not in out and "Traceback" not in err


def test_a_valid_layout_is_launched(tmp_path, no_launch):
    args = ["train", "--data.mock=true", "--parallel.tensor_parallel=2", *SMALL]
    assert cli_main([*args, f"--run_dir={tmp_path / 'r'}"]) == 1  # the fake launch's status
    assert len(no_launch) == 1 and "--parallel.tensor_parallel=2" in no_launch[0]


# ------------------------------------------------------------ item 7: warmup
@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("iters", [1, 20, 100])
def test_every_preset_can_be_shortened(preset, iters):
    cfg = build_config(
        preset=preset, overrides=[f"--training.train_iters={iters}", "--data.mock=true"]
    )
    assert cfg.lr_decay_iters == iters and 0 <= cfg.lr_warmup_iters < iters
    full = build_config(preset=preset, overrides=["--data.mock=true"])
    warmups = {"tiny": 30, "bert-tiny": 30, "t5-tiny": 30, "esm-tiny": 20, "esm2-8m": 2000}
    warmups["sft-tiny"] = warmups["moe-tiny"] = 10
    warmups["long-tiny"] = 6
    assert full.lr_warmup_iters == {**warmups, "gpt2-small": 700, "gpu-1b": 100}[preset]


def test_warmup_iters_and_fraction():
    # an explicit lr_warmup_iters replaces the preset's fraction
    cfg = build_config(preset="tiny", overrides=["--scheduler.lr_warmup_iters=5"])
    assert cfg.lr_warmup_iters == 5 and cfg.scheduler.lr_warmup_fraction is None
    # both set explicitly: Megatron's "can only specify one", naming both
    with pytest.raises(ConfigError) as info:
        build_config(
            overrides=[
                "--data.mock=true",
                "--scheduler.lr_warmup_iters=5",
                "--scheduler.lr_warmup_fraction=0.1",
            ]
        )
    assert info.value.option == "scheduler.lr_warmup_fraction"
    assert "lr_warmup_iters" in info.value.detail
    # a warmup longer than the run says what to set
    with pytest.raises(ConfigError) as info:
        build_config(
            preset="tiny", overrides=["--training.train_iters=20", "--scheduler.lr_warmup_iters=30"]
        )
    assert info.value.option == "scheduler.lr_warmup_iters"
    assert "scheduler.lr_warmup_fraction" in info.value.detail


# ------------------------------------------------------------ item 8: --print-config
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_print_config_works_for_every_preset(preset, capsys):
    assert cli_main(["train", "--preset", preset, "--print-config"]) == 0
    out, err = capsys.readouterr()
    printed = tomllib.loads(out)
    assert printed["model"]["hidden_size"] == PRESETS[preset]["model"]["hidden_size"]
    assert "Traceback" not in err
    data = PRESETS[preset]["data"]
    if not data.get("corpus") and not data.get("mock") and "sft" not in PRESETS[preset]:
        # says what training will need
        assert "note: to train, data.data_path" in err


def test_print_config_round_trips(tmp_path, capsys):
    assert cli_main(["train", "--preset", "gpt2-small", "--print-config"]) == 0
    f = tmp_path / "printed.toml"
    f.write_text(capsys.readouterr().out)
    again = build_config(config_file=f, require_data=False)
    # the derived run directory is printed as a comment: the file trains in its own
    assert again.run_dir == "runs/printed"
    assert again == build_config(
        preset="gpt2-small", overrides=["--run_dir=runs/printed"], require_data=False
    )
    with pytest.raises(ConfigError, match="data.data_path"):
        build_config(config_file=f)


def test_configs_saved_before_exclusive_options_still_load():
    """A run saved with two data sources / both warmup options trained on the winner of the
    old precedence (corpus > mock > paths; fraction > iters); reading it back says so."""
    from epochal.train.config import config_from_dict, config_from_saved

    saved = {
        "data": {"corpus": "stdlib", "mock": True, "data_path": ["/data/x"]},
        "scheduler": {"lr_warmup_iters": 30, "lr_warmup_fraction": 0.1},
    }
    with pytest.raises(ConfigError):
        config_from_dict(saved)
    cfg = config_from_saved(saved)
    assert (cfg.data.corpus, cfg.data.mock, cfg.data.data_path) == ("stdlib", False, [])
    assert cfg.scheduler.lr_warmup_iters == 0 and cfg.lr_warmup_iters == 30
    assert saved["data"]["mock"] is True  # the caller's dict is not changed
    cfg = config_from_saved({"data": {"mock": True, "train_data_path": ["/t"]}})
    assert cfg.data.mock and not cfg.data.has_paths
