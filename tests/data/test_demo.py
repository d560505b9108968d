"""Tests of `epochal demo-epochs`."""

import json
import re
import sys

from epochal.cli import main
from epochal.commands.demo_epochs import CharTokenizer, build_demo
from tests.dist_utils import run_process


def _run(capsys, *argv):
    code = main(["demo-epochs", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _digest(out):
    return re.search(r"rebuilt from scratch with seed \d+: digest (\w+)", out).group(1)


def test_demo_prints_epochs_and_passes_checks(capsys):
    code, out, _ = _run(capsys, "--epochs", "3", "--num-sequences", "5", "--seq-len", "20")
    assert code == 0
    assert out.count("epoch ") >= 3 and "OK:" in out
    orders = [json.loads(m) for m in re.findall(r"order (\[[\d, ]+\])", out)]
    assert len(orders) == 3 and all(sorted(o) == list(range(5)) for o in orders)
    assert "reproducible: yes" in out


def test_demo_is_reproducible_and_seed_dependent(capsys):
    a = _digest(_run(capsys, "--seed", "1")[1])
    b = _digest(_run(capsys, "--seed", "1")[1])
    c = _digest(_run(capsys, "--seed", "2")[1])
    assert a == b != c


def test_demo_samples_match_the_library():
    tok, seqs, resampler = build_demo(
        "abcdefghij" * 3, num_sequences=3, seq_len=10, epochs=2, seed=5, mask_prob=0.5
    )
    assert tok.decode(seqs[0]) == "abcdefghij"
    for g in range(6):
        key = resampler.epoch_index(g)
        sample = resampler[g]
        original = seqs[key.idx]
        kept = ~sample["loss_mask"]
        assert sample["tokens"][kept].tolist() == [t for t, k in zip(original, kept.tolist()) if k]


def test_demo_errors(capsys, tmp_path):
    code, _, err = _run(capsys, "--seq-len", "100000")
    assert code == 2 and "--seq-len" in err
    code, _, err = _run(capsys, "--text-file", str(tmp_path / "missing.txt"))
    assert code == 2 and "missing.txt" in err
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe abc")
    code, _, err = _run(capsys, "--text-file", str(bad))
    assert code == 2 and "bad.txt" in err and "UTF-8" in err
    code, _, err = _run(capsys, "--epochs", "0")
    assert code == 2 and "--epochs" in err
    code, _, err = _run(capsys, "--mask-prob", "1.5")
    assert code == 2 and "--mask-prob" in err
    code, _, err = _run(capsys, "--seed", "-1")
    assert code == 2 and "--seed" in err
    code, out, _ = _run(capsys, "--seed", str(2**64 - 1), "--epochs", "1")  # the largest seed
    assert code == 0 and "seed 0 gives a different run" in out
    text = tmp_path / "t.txt"
    text.write_text("hello world, a text of my own\nwith two lines " * 4, encoding="utf-8")
    code, out, _ = _run(capsys, "--text-file", str(text), "--num-sequences", "3", "--seq-len", "12")
    assert code == 0 and "item 0: |hello world," in out


def test_char_tokenizer_round_trip():
    tok = CharTokenizer("hello")
    assert tok.vocab_size == 5  # mask + e, h, l, o
    assert tok.decode(tok.encode("hello")) == "hello"
    assert tok.decode([0]) == "_"


def test_console_entry_point_runs():
    proc = run_process(
        [sys.executable, "-m", "epochal.cli", "demo-epochs", "--epochs", "2"], timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK: samples are a pure function" in proc.stdout


def test_check_demo_library_reports_the_checks():
    from epochal.data.epochs.demo import check_demo

    options = dict(num_sequences=4, seq_len=10, epochs=3, mask_prob=0.5)
    text = "the quick brown fox jumps over the lazy dog " * 2
    checks = check_demo(text, seed=7, **options)
    assert checks.ok and checks.permutations and checks.digest == checks.rebuilt
    assert checks.other != checks.digest and checks.other_seed == 8
    assert len(checks.orders) == 3 and all(sorted(o) == [0, 1, 2, 3] for o in checks.orders)
    assert check_demo(text, seed=7, **options).digest == checks.digest
    assert check_demo(text, seed=9, **options).digest != checks.digest
