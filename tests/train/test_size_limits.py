"""Sizes that are configuration errors, refused before anything is allocated (issue 26)."""

from __future__ import annotations

import json
import subprocess
import sys

from epochal.cli import main as cli_main


def _train(tmp_path, *args):
    return cli_main(["train", f"--run_dir={tmp_path / 'run'}", "--training.device=cpu", *args])


def test_bert_sequence_beyond_memory_is_a_config_error(tmp_path, capsys):
    assert _train(tmp_path, "--preset=bert-tiny", "--data.seq_length=100000") == 2
    err = capsys.readouterr().err
    assert "data.seq_length" in err and "data.seq_length=100000" in err and "GiB" in err
    assert "training.micro_batch_size=8" in err
    assert not (tmp_path / "run").exists()


def test_t5_decoder_length_beyond_memory_is_a_config_error(tmp_path, capsys):
    assert _train(tmp_path, "--preset=t5-tiny", "--data.seq_length_decoder=100000") == 2
    err = capsys.readouterr().err
    assert "data.seq_length_decoder" in err and "data.seq_length_decoder=100000" in err


def test_the_refusal_is_quick_and_small(tmp_path):
    """In a subprocess: the error comes without allocating the mask (bounded peak memory)."""
    code = (
        "import resource, sys\n"
        "from epochal.cli import main\n"
        f"rc = main(['train', '--run_dir={tmp_path / 'r'}', '--preset=t5-tiny',"
        " '--data.seq_length_decoder=100000', '--training.device=cpu'])\n"
        "print(rc, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    rc, peak_kib = out.stdout.split()
    assert rc == "2", out.stderr
    assert int(peak_kib) < 2 * 2**20, f"peak RSS {peak_kib} KiB"  # < 2 GiB (a mask is 10 GiB)


def test_init_from_a_checkpoint_with_fewer_positions_names_both(tmp_path, capsys):
    step = tmp_path / "ckpt" / "step_0000001"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text(
        json.dumps({"step": 1, "model_config": {"max_position_embeddings": 512}})
    )
    rc = _train(
        tmp_path,
        "--data.corpus=",
        "--data.mock=true",
        "--model.vocab_size=128",
        f"--checkpoint.init_from={step}",
        "--data.seq_length=100000",
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "data.seq_length=100000" in err and "512 positions" in err
    assert "model.max_position_embeddings=512" in err and "trainer_state.json" in err


def test_ordinary_lengths_pass():
    from epochal.train.config import build_config
    from epochal.train.config.limits import check_sizes

    for preset in ("bert-tiny", "t5-tiny", "tiny"):
        check_sizes(build_config(preset=preset, overrides=["--data.seq_length=128"]))
