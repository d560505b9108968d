"""Metrics JSONL (segments, torn lines), TensorBoard events, `epochal plot`."""

from __future__ import annotations

import pytest

from epochal.cli import main as cli_main
from epochal.train.observe.metrics import MetricsLogger, read_metrics
from epochal.train.observe.plot import plot_run


def write_run(run_dir, steps, start=0, tensorboard=False):
    m = MetricsLogger(
        run_dir,
        total_steps=steps,
        start_step=start,
        progress=False,
        tensorboard=tensorboard,
        log_interval=2,
        verbose=False,
    )
    for s in range(start + 1, steps + 1):
        m.log_train(s, {"loss": 5.0 / s, "lr": 1e-3, "tokens_per_s": 100.0})
        if s % 4 == 0:
            m.log_eval(s, 4.0 / s)
    m.close()


def test_segments_and_torn_line(tmp_path):
    write_run(tmp_path, 8)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "segm')  # killed mid-write
    write_run(tmp_path, 10, start=4)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    segs = [r for r in recs if r["kind"] == "segment"]
    assert [(s["segment"], s["start_step"]) for s in segs] == [(0, 0), (1, 4)]
    train = [(r["segment"], r["step"]) for r in recs if r["kind"] == "train"]
    assert train == [(0, s) for s in range(1, 9)] + [(1, s) for s in range(5, 11)]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert evals[0]["ppl"] == pytest.approx(2.718281828**1.0, rel=1e-6)
    with pytest.raises(FileNotFoundError, match="metrics"):
        read_metrics(tmp_path / "none.jsonl")


def test_tensorboard_events(tmp_path):
    pytest.importorskip("tensorboard")
    write_run(tmp_path, 4, tensorboard=True)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_plot_and_cli(tmp_path, capsys):
    write_run(tmp_path, 8)
    write_run(tmp_path, 8, start=3)
    out = plot_run(tmp_path)
    assert out == tmp_path / "loss.png" and out.read_bytes()[:4] == b"\x89PNG"
    assert cli_main(["plot", str(tmp_path), "-o", str(tmp_path / "p.png")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "p.png")
    assert cli_main(["plot", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no training steps"):
        plot_run(tmp_path / "empty")


def capture_figures(monkeypatch) -> list:
    """The figures the plot functions save from now on (they are written as usual)."""
    from epochal.train.observe import plot

    figures, save = [], plot.save_figure
    monkeypatch.setattr(plot, "save_figure", lambda fig, out: figures.append(fig) or save(fig, out))
    return figures


def whole_ticks(ax) -> list[float]:
    """The step axis' tick positions inside the drawn range."""
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_a_short_plot_ticks_whole_steps_and_draws_a_resume_as_a_line(tmp_path, monkeypatch):
    write_run(tmp_path, 4)
    write_run(tmp_path, 4, start=2)  # resumed after step 2
    figures = capture_figures(monkeypatch)
    plot_run(tmp_path)
    (ax,) = figures[0].axes
    ticks = whole_ticks(ax)
    assert len(ticks) >= 2 and all(t == int(t) for t in ticks), ticks
    lines = {line.get_label(): line for line in ax.get_lines()}
    resumed = lines["train (resumed, segment 1)"]
    assert list(resumed.get_xdata()) == [3, 4]
    assert resumed.get_linestyle() not in ("None", "", " ") and resumed.get_linewidth() > 0
    assert lines["validation (segment 1)"].get_linestyle() not in ("None", "", " ")


def test_a_starving_expert_is_reported_once_and_per_block_records_stay_off_the_eval_line(
    tmp_path, capsys
):
    m = MetricsLogger(tmp_path, total_steps=3, progress=False, tensorboard=False, verbose=True)
    shares = {"tokens_per_expert/layer_0/expert_0": 1.0, "tokens_per_expert/layer_0/expert_1": 0.0}
    for step in (1, 2):
        m.log_train(step, {"loss": 1.0, "lr": 1e-3, **shares})
    m.log_eval(2, 1.0, {"load_balancing_loss": 2.0, **shares})
    m.close()
    out = capsys.readouterr().out
    assert out.count("layer_0/expert_1 received no tokens") == 1
    assert "step 1: warning" in out
    eval_line = next(line for line in out.splitlines() if "validation loss" in line)
    assert "load_balancing_loss 2" in eval_line and "tokens_per_expert" not in eval_line
