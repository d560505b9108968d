"""Training on a scheduled blend: the ledger, stop-and-resume, a changed future, a refused past.

Three corpora, a schedule with a jump, a linear ramp and a source entering at step
10; a tiny GPT on CPU, global batch 8, 30 steps.
"""

from __future__ import annotations

import json
import shutil

import pytest

from epochal.cli import main
from epochal.model.config import ConfigError
from epochal.train.config import build_config
from epochal.train.observe.metrics import read_metrics
from epochal.train.trainer import Trainer
from tests.tiny_gpt_args import TINY_GPT_ARGS

STEPS = 30
GBS = 8
SCHEDULE = (
    "[{step=0, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 1]},"
    " {step=15, weights=[0.2, 0.5, 0.3]}, {step=25, weights=[0.6, 0.1, 0.3]}]"
)
# the same up to step 23, then c only from step 23 on
FUTURE = (
    "[{step=0, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 1]},"
    " {step=15, weights=[0.2, 0.5, 0.3]}, {step=23, weights=[0.52, 0.18, 0.3]},"
    " {step=23, weights=[0, 0, 1]}]"
)
# the ramp moved: steps 16-23 change
PAST = (
    "[{step=0, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 0]}, {step=10, weights=[1, 1, 1]},"
    " {step=15, weights=[0.2, 0.5, 0.3]}, {step=20, weights=[0.6, 0.1, 0.3]}]"
)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    from epochal.data.indexed.preprocess import preprocess_documents
    from epochal.data.indexed.tokenizer import build_tokenizer

    root = tmp_path_factory.mktemp("blend_corpora")
    tokenizer = build_tokenizer("ByteLevelTokenizer")
    prefixes = []
    for name, letters in (("a", "abc"), ("b", "defg"), ("c", "hi")):
        docs = [f"{name} {i}: " + letters[i % len(letters)] * (8 + i % 13) for i in range(120)]
        preprocess_documents(docs, tokenizer, root / name)
        prefixes.append(str(root / name))
    return prefixes


def options(corpora, run_dir, cache, schedule=SCHEDULE, *extra):
    paths = json.dumps([x for p in corpora for x in ("1", p)])
    return [
        "--training.device=cpu",
        "--data.corpus=",
        *TINY_GPT_ARGS,
        "--data.mock=false",
        f"--data.data_path={paths}",
        "--data.split=100,0,0",
        "--data.tokenizer_type=ByteLevelTokenizer",
        "--model.vocab_size=259",
        f"--data.blend_schedule={schedule}",
        "--data.blend_schedule_interpolation=linear",
        "--training.micro_batch_size=8",
        f"--training.global_batch_size={GBS}",
        f"--training.train_iters={STEPS}",
        "--training.eval_interval=0",
        "--training.eval_iters=0",
        "--checkpoint.save_interval=23",
        "--logging.progress=false",
        "--logging.tensorboard=false",
        f"--data.cache_dir={cache}",
        f"--run_dir={run_dir}",
        *extra,
    ]


def train(*args):
    return Trainer(build_config(preset="tiny", overrides=list(args)), log=False).train()


def records(run_dir) -> dict[int, dict]:
    """The latest train record of each step."""
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"}


@pytest.fixture(scope="module")
def runs(corpora, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("blend_runs")
    cache = tmp / "cache"
    full = tmp / "full"
    train(*options(corpora, full, cache))
    stopped = tmp / "stopped"
    train(*options(corpora, stopped, cache, SCHEDULE, "--training.exit_interval=23"))
    changed = tmp / "changed"
    shutil.copytree(stopped, changed)
    train(*options(corpora, stopped, cache))  # resumes after step 23 with the same schedule
    train(*options(corpora, changed, cache, FUTURE))
    return {"full": full, "stopped": stopped, "changed": changed, "cache": cache}


def test_the_ledger_follows_the_schedule_and_a_resume_reads_the_same(runs):
    full, resumed = records(runs["full"]), records(runs["stopped"])
    assert sorted(full) == sorted(resumed) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert sum(full[step]["sources"]) == GBS
        assert resumed[step]["sources"] == full[step]["sources"], step
        assert resumed[step]["sample_digest"] == full[step]["sample_digest"], step
        assert resumed[step]["loss"] == full[step]["loss"], step
    assert all(full[s]["sources"][2] == 0 for s in range(1, 11))  # c enters at step 10
    assert sum(full[s]["sources"][2] for s in range(11, 16)) == pytest.approx(5 * GBS / 3, abs=1)


def test_a_changed_future_continues_from_the_ledger(runs):
    full, changed = records(runs["full"]), records(runs["changed"])
    for step in range(1, 24):
        assert changed[step]["sample_digest"] == full[step]["sample_digest"]
    # from step 24 on only c, each of its samples the next one it had not served
    assert all(changed[s]["sources"][:2] in ([0, 0], [0, 1], [1, 0]) for s in range(24, STEPS + 1))
    assert sum(sum(changed[s]["sources"][:2]) for s in range(24, STEPS + 1)) <= 2


def test_inspect_sources_prints_the_ledger(runs, capsys):
    capsys.readouterr()
    assert main(["inspect", str(runs["changed"]), "--sources", "--json"]) == 0
    ledger = json.loads(capsys.readouterr().out)
    rec = records(runs["changed"])
    served = [sum(rec[s]["sources"][i] for s in range(1, STEPS + 1)) for i in range(3)]
    assert [e["samples"] for e in ledger["sources"]] == served
    assert [e["next_sample"] for e in ledger["sources"]] == served
    assert ledger["step"] == STEPS
    assert main(["inspect", str(runs["changed"]), "--sources"]) == 0
    text = capsys.readouterr().out
    assert "samples" in text and "epoch" in text and "next" in text


# a constant mix (Megatron's blend) until step 12, then c only
CONSTANT = "[{step=0, weights=[1, 1, 1]}]"
REVISED = (
    "[{step=0, weights=[1, 1, 1]}, {step=12, weights=[1, 1, 1]}, {step=12, weights=[0, 0, 1]}]"
)


@pytest.fixture(scope="module")
def revised(corpora, runs):
    """A run with a constant schedule stopped after step 12, resumed with c only from there."""
    run = runs["cache"].parent / "revised"
    short = ["--training.train_iters=16", "--checkpoint.save_interval=12"]
    train(*options(corpora, run, runs["cache"], CONSTANT, *short, "--training.exit_interval=12"))
    train(*options(corpora, run, runs["cache"], REVISED, *short))
    return run


@pytest.mark.parametrize(
    "run, steps",
    [("revised", [1, 10, 12, 13, 16]), ("changed", [23, 24, STEPS])],
)
def test_inspect_step_lists_what_the_run_drew_across_a_revision(runs, revised, run, steps, capsys):
    from epochal.train.inputs.run_samples import run_step_samples

    run_dir = revised if run == "revised" else runs[run]
    recorded = records(run_dir)
    for step in steps:  # before the resume: the old schedule's samples; after: the new one's
        assert run_step_samples(run_dir, step).samples.digest == recorded[step]["sample_digest"]
    if run == "revised":
        assert all(recorded[s]["sources"] == [0, 0, GBS] for s in (13, 16))
        assert all(min(recorded[s]["sources"]) >= 2 for s in (1, 10, 12))
    capsys.readouterr()
    assert main(["inspect", str(run_dir), "--step", str(steps[1])]) == 0
    text = capsys.readouterr().out
    assert "as recorded in metrics.jsonl" in text and "warning" not in text


def test_a_changed_past_is_refused(runs, corpora, tmp_path):
    run = tmp_path / "past"
    shutil.copytree(runs["full"], run)
    at_23 = f"--checkpoint.resume={run / 'checkpoints' / 'step_0000023'}"
    with pytest.raises(ConfigError, match=r"data.blend_schedule.*the weights at step 16 differ"):
        train(*options(corpora, run, runs["cache"], PAST, at_23))


def test_plot_mix_draws_the_realised_mix(runs, capsys, monkeypatch):
    from epochal.train.observe.metrics import read_metrics as read
    from epochal.train.observe.mix_plot import realised_mix
    from tests.train.test_metrics_plot import capture_figures, whole_ticks

    figures = capture_figures(monkeypatch)

    steps, counts, resumes = realised_mix(read(runs["changed"] / "metrics.jsonl"))
    assert steps == list(range(1, STEPS + 1)) and resumes == [24]
    assert counts[23:] == [records(runs["changed"])[s]["sources"] for s in range(24, STEPS + 1)]
    capsys.readouterr()
    assert main(["plot", str(runs["changed"]), "--mix"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.endswith("mix.png") and (runs["changed"] / "mix.png").stat().st_size > 1000
    (ax,) = figures[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b", "c"]  # data_path's
    assert all(t == int(t) for t in whole_ticks(ax))
    # every curve holds each step's value flat: the jump at step 23 (c only from step 24) is
    # vertical, at x = 23, between step 23's share of c and step 24's
    curves = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
    assert curves and all(line.get_drawstyle() == "steps-post" for line in curves)
    c_share = [r["sources"][2] / GBS for r in (records(runs["changed"])[s] for s in (23, 24))]
    below_c = curves[2]  # the top of b's area: where c's area starts
    x, y = list(below_c.get_xdata()), list(below_c.get_ydata())
    assert x[22:24] == [22, 23] and [1 - v for v in y[22:24]] == pytest.approx(c_share)


@pytest.mark.parametrize(
    "schedule, interpolation, message",
    [
        ("[{step=0, weights=[1, 1]}]", "step", "point 0 (step 0): needs 3 weights"),
        ("[{step=0, weights=[1, -1, 1]}]", "step", "weights must be numbers >= 0"),
        ("[{step=0, weights=[0, 0, 0]}]", "step", "at least one weight must be > 0"),
        (
            "[{step=5, weights=[1, 1, 1]}, {step=4, weights=[1, 1, 1]}]",
            "step",
            "point 1: steps must increase",
        ),
        (
            "[{step=5, weights=[1, 1, 1]}, {step=5, weights=[1, 0, 1]}, {step=5, weights=[1, 1, 0]}]",
            "linear",
            "got step 5 after step 5 twice",
        ),
        ("[{step=0}]", "step", "point 0 must be {step = S, weights = [...]}"),
        ("[{step=0, weights=[1, 1, 1]}]", "cubic", "must be 'step' or 'linear'"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_option(schedule, interpolation, message):
    paths = json.dumps(["1", "a", "1", "b", "1", "c"])
    with pytest.raises(ConfigError) as err:
        build_config(
            preset="tiny",
            overrides=[
                "--data.corpus=",
                f"--data.data_path={paths}",
                f"--data.blend_schedule={schedule}",
                f"--data.blend_schedule_interpolation={interpolation}",
            ],
        )
    option = "blend_schedule_interpolation" if interpolation == "cubic" else "blend_schedule"
    assert str(err.value).startswith(f"data.{option}: ")
    assert message in str(err.value)


def test_a_schedule_needs_a_blend():
    with pytest.raises(ConfigError, match="data.blend_schedule: needs a blend of at least two"):
        build_config(
            preset="tiny",
            overrides=[
                "--data.corpus=",
                "--data.data_path=['a']",
                "--data.blend_schedule=[{step=0, weights=[1]}]",
            ],
        )


def test_steps_become_samples_under_a_batch_size_rampup():
    """Point ``step = S`` holds from the sample after the first S steps of the ramp."""
    from epochal.data.loading.microbatches import build_num_microbatches_calculator
    from epochal.train.inputs.gpt import blend_schedule_from_config, sample_to_step

    config = build_config(
        preset="tiny",
        overrides=[
            "--data.corpus=",
            "--data.data_path=['1', 'a', '1', 'b']",
            "--training.global_batch_size=8",
            "--training.micro_batch_size=2",
            "--training.rampup_batch_size=[2, 2, 40]",
            "--data.blend_schedule=[{step=0, weights=[1, 0]}, {step=5, weights=[1, 1]}]",
        ],
    )
    schedule, first_weights = blend_schedule_from_config(config)
    calc = build_num_microbatches_calculator(8, 2, 1, [2, 2, 40])
    assert schedule.samples == [0, calc.consumed_samples_after(5)] and first_weights == [1, 0]
    step_of = sample_to_step(config)
    assert step_of(calc.consumed_samples_after(5)) == 6
    assert step_of(calc.consumed_samples_after(5) - 1) == 5
