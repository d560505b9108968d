"""Blend weights that follow a schedule: exact counts, no repeats, resumes, Megatron parity."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from epochal.data.datasets.blend_schedule import BlendSchedule, BlendSelector
from epochal.data.datasets.dataset_builder import GPTDatasetConfig, build_gpt_datasets
from epochal.data.datasets.scheduled_blend import (
    BlendScheduleChangeError,
    ScheduledBlendedDataset,
    blend_ledger,
)
from tests.data.gpt_corpus import EOD, random_documents, write_ours

GBS = 8
STEPS = 60
# source 2 enters at step 10, a step change at step 20 (two points at one step make a
# jump, also in a linear schedule), a linear ramp from step 30 to step 45
POINTS = [
    (0, [1, 1, 0]),
    (10, [1, 1, 0]),
    (10, [1, 1, 1]),
    (20, [1, 1, 1]),
    (20, [0.2, 0.5, 0.3]),
    (30, [0.2, 0.5, 0.3]),
    (45, [0.6, 0.1, 0.3]),
]


def linear_schedule(points=POINTS, gbs=GBS):
    """Step points as the trainer converts them: step S starts at global sample S * gbs."""
    steps = [s for s, _ in points]
    return BlendSchedule([(s * gbs, w) for s, w in points], "linear", steps)


def reference_targets(points, interpolation, n_samples, gbs=GBS):
    """The schedule's integral, written independently: shares of every sample, summed in floats."""
    starts = [s * gbs for s, _ in points]
    shares = [np.asarray(w, float) / np.sum(w) for _, w in points]
    per_sample = np.empty((n_samples, len(shares[0])))
    for i in range(n_samples):
        k = max(0, int(np.searchsorted(starts, i, side="right")) - 1)  # the later of a jump
        if interpolation == "linear" and k + 1 < len(points) and i >= starts[0]:
            f = (i - starts[k]) / (starts[k + 1] - starts[k])
            per_sample[i] = shares[k] + f * (shares[k + 1] - shares[k])
        else:
            per_sample[i] = shares[k]
    return np.vstack([np.zeros(len(shares[0])), np.cumsum(per_sample, axis=0)])


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("blend_schedule"))
    return [
        write_ours(root, "a", random_documents(1, 300, max_length=40)),
        write_ours(root, "b", random_documents(2, 200, max_length=60)),
        write_ours(root, "c", random_documents(3, 250, max_length=25)),
    ]


def gpt_blend(corpora, schedule, size=STEPS * GBS, weights=("1", "1", "1"), **kw):
    data_path = [x for w, p in zip(weights, corpora) for x in (w, p)]
    config = GPTDatasetConfig(
        seq_length=12,
        seed=7,
        eod_token_id=EOD,
        data_path=data_path,
        split="100,0,0",
        blend_schedule=schedule,
        **kw,
    )
    return build_gpt_datasets(config, [size, 0, 0])[0]


@pytest.mark.parametrize("interpolation", ["linear", "step"])
def test_three_sources_follow_the_integral_per_step_and_never_repeat(corpora, interpolation):
    steps = [s for s, _ in POINTS]
    schedule = BlendSchedule([(s * GBS, w) for s, w in POINTS], interpolation, steps)
    blend = gpt_blend(corpora, schedule)
    assert isinstance(blend, ScheduledBlendedDataset) and len(blend) == STEPS * GBS
    target = reference_targets(POINTS, interpolation, STEPS * GBS)
    seen: list[set] = [set(), set(), set()]
    served = np.zeros(3, dtype=np.int64)
    for step in range(STEPS):
        before = served.copy()
        for n in range(step * GBS, (step + 1) * GBS):
            sample = blend[n]
            s = int(sample["dataset_id"])
            identity = blend.sample_identity(n)
            assert identity["corpus"] == s
            # each source's samples in its own order, none twice (one epoch covers the run)
            assert identity["epoch"] == 0
            key = repr(identity["documents"]) + repr(identity["window"])
            assert key not in seen[s], (step, s)
            seen[s].add(key)
            served[s] += 1
        end = (step + 1) * GBS
        # the counts stay within one sample of the integral at every global batch: no drift
        assert np.all(np.abs(served - target[end]) < 1.0), (step, served, target[end])
        per_step = served - before
        assert np.all(np.abs(per_step - (target[end] - target[step * GBS])) < 2.0)
        assert blend.source_counts(end, step * GBS) == per_step.tolist()
    # source 2 enters at step 10: nothing from it before
    assert blend.source_counts(10 * GBS)[2] == 0
    assert blend.source_counts(11 * GBS)[2] > 0
    # where each source's next sample starts
    ledger = blend_ledger(blend, STEPS * GBS)
    assert [e["samples"] for e in ledger] == served.tolist() == [e["next_sample"] for e in ledger]


def test_selector_is_a_pure_function_of_the_sample_number():
    schedule = linear_schedule()
    a, b = BlendSelector(schedule), BlendSelector(schedule)
    order = list(range(480))
    forward = [a.locate(n) for n in order]
    backward = [b.locate(n) for n in reversed(order)][::-1]
    assert forward == backward
    counts = [0, 0, 0]
    for n, (s, j) in enumerate(forward):
        assert j == counts[s]  # 0, 1, 2, ... per source: no gap, no repeat
        counts[s] += 1
        if n % 37 == 0:
            assert a.counts(n + 1) == counts
    # far into a long run: still exact, still cheap
    long = BlendSchedule([(0, [1, 0, 3]), (10**9, [1, 2, 1]), (3 * 10**9, [0, 1, 1])], "linear")
    sel = BlendSelector(long)
    start = 2 * 10**9 + 12345
    counts = sel.counts(start)
    assert sum(counts) == start
    for n in range(start, start + 200):
        s, j = sel.locate(n)
        assert j == counts[s]
        counts[s] += 1
    exact = long.targets(start + 200)
    assert all(abs(c - float(t)) < 1 for c, t in zip(counts, exact))


def test_pickled_blend_reads_the_same(corpora):
    blend = gpt_blend(corpora, linear_schedule())
    again = pickle.loads(pickle.dumps(blend))
    for n in (0, 77, 301, 479):
        assert again.sample_identity(n) == blend.sample_identity(n)


def test_schedule_rejects_bad_points():
    with pytest.raises(ValueError, match="point 1: has 2 weights"):
        BlendSchedule([(0, [1, 1, 1]), (8, [1, 1])])
    with pytest.raises(ValueError, match="increasing"):
        BlendSchedule([(8, [1, 1]), (7, [1, 2])])
    with pytest.raises(ValueError, match="at most two points"):
        BlendSchedule([(8, [1, 1]), (8, [1, 2]), (8, [1, 3])])
    with pytest.raises(ValueError, match="point 0: at least one weight"):
        BlendSchedule([(0, [0, 0])])
    with pytest.raises(ValueError, match="must be >= 0"):
        BlendSchedule([(0, [1, -1])])
    with pytest.raises(ValueError, match="'step' or 'linear'"):
        BlendSchedule([(0, [1, 1])], "cubic")


# ------------------------------------------------------------------ resume
def identities(blend, start, stop):
    return [blend.sample_identity(n) for n in range(start, stop)]


def test_same_schedule_resume_reads_the_same(corpora):
    full = gpt_blend(corpora, linear_schedule())
    resumed = gpt_blend(corpora, linear_schedule())
    assert resumed.resume(full.blend_state(), 23 * GBS) is None
    assert identities(resumed, 0, len(full)) == identities(full, 0, len(full))


def test_future_change_continues_every_source_where_it_stopped(corpora):
    first = gpt_blend(corpora, linear_schedule())
    cut = 23 * GBS
    changed = [
        *POINTS[:5],
        (23, [0.2, 0.5, 0.3]),
        (30, [0, 0, 1]),
        (30, [0, 0, 1]),
        (35, [0, 0, 1]),
        (50, [1, 0, 0]),
    ]
    resumed = gpt_blend(corpora, linear_schedule(changed))
    note = resumed.resume(first.blend_state(), cut, step_of=lambda n: n // GBS + 1)
    assert note.startswith("data.blend_schedule changed from step 24 on")
    assert identities(resumed, 0, cut) == identities(first, 0, cut)  # the past as it was
    before = first.source_counts(cut)
    # every source continues with its next sample: nothing re-read, nothing skipped
    served = list(before)
    for n in range(cut, len(resumed)):
        s = resumed[n]["dataset_id"]
        assert resumed.sample_identity(n) == resumed.datasets[s].sample_identity(served[s]) | {
            "corpus": s
        }
        served[s] += 1
    # and from there the counts follow the new schedule's integral
    target = reference_targets(changed, "linear", len(resumed))
    for step in range(24, STEPS + 1):
        got = np.array(resumed.source_counts(step * GBS))
        assert np.all(np.abs(got - target[step * GBS]) < 2.0), step
    # steps 31-35 have only c's weight: a and b at most catch up the one sample they lagged
    assert max(resumed.source_counts(35 * GBS, 30 * GBS)[:2]) <= 1
    assert resumed.source_counts(35 * GBS, 30 * GBS)[2] >= 5 * GBS - 2
    # a later resume with that schedule keeps both revisions (and reads the same)
    again = gpt_blend(corpora, linear_schedule(changed))
    assert again.resume(resumed.blend_state(), 40 * GBS) is None
    assert identities(again, 0, len(again)) == identities(resumed, 0, len(resumed))


def test_a_changed_past_is_refused_naming_the_step(corpora):
    first = gpt_blend(corpora, linear_schedule())
    # moving the ramp's end (point 45) changes the weights from the ramp's second sample on:
    # global sample 241, read by step 31 (point S holds from the step after S steps)
    moved = [*POINTS[:6], (40, [0.6, 0.1, 0.3])]
    with pytest.raises(BlendScheduleChangeError, match="changes the past: the weights at step 31 "):
        gpt_blend(corpora, linear_schedule(moved)).resume(
            first.blend_state(), 35 * GBS, step_of=lambda n: n // GBS + 1
        )
    earlier = [(0, [1, 1, 0]), (5, [1, 1, 0]), (5, [1, 1, 1]), *POINTS[3:]]
    with pytest.raises(BlendScheduleChangeError, match="at step 6 "):
        gpt_blend(corpora, linear_schedule(earlier)).resume(
            first.blend_state(), 35 * GBS, step_of=lambda n: n // GBS + 1
        )


def test_a_run_without_schedule_continues_with_one(corpora):
    """A weighted data_path run (Megatron's blend) resumed with a schedule for its future."""
    weights = ("0.3", "0.5", "0.2")
    plain = gpt_blend(corpora, None, weights=weights)
    cut = 20 * GBS
    future = [(0, [0.3, 0.5, 0.2]), (20, [0.3, 0.5, 0.2]), (30, [0, 0, 1])]
    resumed = gpt_blend(corpora, linear_schedule(future), weights=weights)
    assert resumed.resume(None, cut) is not None
    assert identities(resumed, 0, cut) == identities(plain, 0, cut)
    served = plain.source_counts(cut)
    for n in range(cut, 40 * GBS):
        s = resumed[n]["dataset_id"]
        assert (
            resumed.sample_identity(n)["window"]
            == resumed.datasets[s].sample_identity(served[s])["window"]
        )
        served[s] += 1
    wrong = [(0, [0.5, 0.3, 0.2]), (30, [0, 0, 1])]
    with pytest.raises(BlendScheduleChangeError, match="global sample 0 "):
        gpt_blend(corpora, linear_schedule(wrong), weights=weights).resume(None, cut)


@pytest.mark.parametrize("kind", ["bert", "t5"])
def test_bert_and_t5_blends_follow_a_schedule(tmp_path, kind):
    """The masked datasets' train blend takes the schedule; a source grows by extra epochs."""
    pytest.importorskip("transformers")
    from epochal.data import BERTDatasetConfig, build_bert_datasets
    from epochal.data.datasets.t5_builder import T5DatasetConfig, build_t5_datasets
    from epochal.data.indexed.tokenizer_wordpiece import BertWordPieceTokenizer
    from tests.data.bert_corpus import (
        BertVocabTokenizer,
        random_sentence_documents,
        write_sentence_corpus,
        write_vocab,
    )

    directory = str(tmp_path)
    if kind == "t5":
        tokenizer = BertWordPieceTokenizer(write_vocab(directory), vocab_extra_ids=100)
    else:
        tokenizer = BertVocabTokenizer(write_vocab(directory))
    prefixes = [
        write_sentence_corpus(directory, f"c{i}", random_sentence_documents(10 + i, 30), False)
        for i in range(2)
    ]
    schedule = BlendSchedule([(0, [1, 0]), (40, [1, 0]), (40, [0, 1])], "step", [0, 5, 5])
    paths = ["1", prefixes[0], "1", prefixes[1]]
    if kind == "bert":
        config = BERTDatasetConfig(
            seq_length=24,
            tokenizer=tokenizer,
            data_path=paths,
            split="100,0,0",
            blend_schedule=schedule,
        )
        train = build_bert_datasets(config, [400, 0, 0])[0]
    else:
        config = T5DatasetConfig(
            seq_length=24,
            seq_length_decoder=12,
            tokenizer=tokenizer,
            data_path=paths,
            split="100,0,0",
            blend_schedule=schedule,
        )
        train = build_t5_datasets(config, [400, 0, 0])[0]
    assert isinstance(train, ScheduledBlendedDataset)
    assert train.source_counts(40) == [40, 0]
    assert train.source_counts(400, 40) == [0, 360]
    source = train.datasets[1]
    assert source.num_epochs > 1  # grown by extra epochs for what the schedule asks
    seen = [repr(train.sample_identity(n)) for n in range(40, 400)]
    assert len(set(seen)) == len(seen)
    assert train[100]["dataset_id"] == 1


def test_a_step_of_a_constant_blend_counts_only_its_own_samples(corpora, monkeypatch):
    """A step's ledger of a blend built as Megatron's index reads that step's samples only."""
    from epochal.data.datasets import scheduled_blend

    blend = gpt_blend(corpora, BlendSchedule([(0, [1, 2, 1])]))
    corpus = np.array([blend.sample_identity(i)["corpus"] for i in range(len(blend))])
    read = []
    bincount = np.bincount
    monkeypatch.setattr(
        scheduled_blend.np, "bincount", lambda x, **kw: read.append(len(x)) or bincount(x, **kw)
    )
    for start, end in ((0, GBS), (17 * GBS, 18 * GBS), (40 * GBS, 59 * GBS + 3)):
        read.clear()
        expected = np.bincount(corpus[start:end], minlength=3).tolist()
        assert blend.source_counts(end, start) == expected
        assert max(read) <= end - start
    assert blend.source_counts(len(blend)) == np.bincount(corpus, minlength=3).tolist()
