"""Fine-tuning rows tokenized once into a cached token store: the same samples, built once,
rebuilt when anything behind the tokens changes, never read half-written."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import textwrap
import warnings

import pytest
import torch

from epochal.data.datasets.index_cache import CacheRebuildWarning, describe
from epochal.data.sft import (
    PackedSFTDataset,
    SFTDataset,
    build_sft_datasets,
    load_chat_tokenizer,
    read_sft_rows,
    tokenize_sft_rows,
)
from epochal.data.sft.examples import CHAT_FILE, TOKENIZER_DIR
from epochal.data.sft.row_cache import rows_identity
from tests.dist_utils import run_gloo, run_process

pytest.importorskip("transformers")

SEQ = 96


@pytest.fixture(scope="module")
def tokenizer():
    return load_chat_tokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rows") / "chat.jsonl"
    shutil.copy(CHAT_FILE, path)
    return path


@pytest.fixture(scope="module")
def reference(rows_file, tokenizer):
    """The datasets of the in-memory tokenization (``tokenize_sft_rows`` of the rows)."""
    rows = read_sft_rows(rows_file)
    examples = tokenize_sft_rows(rows[:144], tokenizer, max_length=SEQ).examples
    valid = tokenize_sft_rows(rows[144:], tokenizer, max_length=SEQ).examples
    pad = tokenizer.pad_token_id
    return {
        packing: [
            kind(e, SEQ, pad_token_id=pad, create_attention_mask=packing) for e in (examples, valid)
        ]
        for packing, kind in ((False, SFTDataset), (True, PackedSFTDataset))
    }


def _samples(dataset):
    return [dataset[i] for i in range(len(dataset))]


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(_samples(ours), _samples(theirs), strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def _build(path, tokenizer, cache, *, packing=True, log=None, **options):
    return build_sft_datasets(
        path,
        tokenizer,
        seq_length=SEQ,
        split="90,10",
        packing=packing,
        create_attention_mask=packing,
        cache_dir=cache,
        log=log,
        **options,
    )


@pytest.mark.parametrize("packing", [False, True])
def test_cached_samples_are_bit_identical_to_the_in_memory_tokenization(
    packing, rows_file, tokenizer, reference, tmp_path
):
    for cache in (tmp_path / "cache", None, tmp_path / "cache"):  # build, no cache, reuse
        built = _build(rows_file, tokenizer, cache, packing=packing)
        _assert_same(built.train, reference[packing][0])
        _assert_same(built.valid, reference[packing][1])
        restored = pickle.loads(pickle.dumps(built.train))  # as DataLoader workers get it
        _assert_same(restored, reference[packing][0])
        ids = [built.train.sample_identity(i) for i in range(len(built.train))]
        assert ids == [reference[packing][0].sample_identity(i) for i in range(len(ids))]
    rows = read_sft_rows(rows_file)
    report = tokenize_sft_rows(rows[:144], tokenizer, max_length=SEQ).report
    assert built.reports["train"] == report


def test_the_store_is_built_once_and_reused(rows_file, tokenizer, tmp_path):
    cache = tmp_path / "cache"
    said = []
    _build(rows_file, tokenizer, cache, log=said.append)
    assert any("tokenizing once into" in line for line in said)
    said.clear()
    _build(rows_file, load_chat_tokenizer(TOKENIZER_DIR), cache, log=said.append)
    assert said == [f"sft rows of {rows_file}: tokenized before, read from {next(cache.iterdir())}"]
    assert len(list(cache.iterdir())) == 1
    files = sorted(p.name for p in next(cache.iterdir()).iterdir())
    assert files == [
        "examples.npy",
        "loss_mask.bin",
        "loss_mask.idx",
        "rows.npy",
        "store.json",
        "tokens.bin",
        "tokens.idx",
    ]


def test_the_key_covers_the_bytes_the_tokenizer_the_template_and_the_options(
    rows_file, tokenizer, tmp_path
):
    options = {"max_length": SEQ, "loss_on": "completion", "overlength": "error"}
    key = describe(rows_identity(rows_file, tokenizer, **options))[1]
    again = load_chat_tokenizer(TOKENIZER_DIR)  # another load of the same folder: the same key
    assert describe(rows_identity(rows_file, again, **options))[1] == key
    changed = tmp_path / "chat.jsonl"
    text = rows_file.read_text()
    changed.write_text(text.replace("Tuesday", "Tuesdaz", 1))  # one byte, same size
    assert changed.stat().st_size == rows_file.stat().st_size
    plain = load_chat_tokenizer(TOKENIZER_DIR)
    plain.chat_template = plain.chat_template.replace("{% generation %}", "")
    other = [
        describe(rows_identity(changed, tokenizer, **options))[1],
        describe(rows_identity(rows_file, plain, **options))[1],
        describe(rows_identity(rows_file, tokenizer, **{**options, "loss_on": "all"}))[1],
        describe(rows_identity(rows_file, tokenizer, **{**options, "max_length": 64}))[1],
        describe(rows_identity(rows_file, tokenizer, **{**options, "overlength": "skip"}))[1],
    ]
    assert len({key, *other}) == 6


def test_rewritten_bytes_are_tokenized_anew(rows_file, tokenizer, reference, tmp_path):
    path = tmp_path / "chat.jsonl"
    shutil.copy(rows_file, path)
    cache = tmp_path / "cache"
    first = _build(path, tokenizer, cache, packing=False)
    lines = path.read_text().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]  # same bytes, other order: rows 0 and 1 swap
    path.write_text("".join(lines))
    second = _build(path, tokenizer, cache, packing=False)
    assert len(list(cache.iterdir())) == 2
    assert torch.equal(second.train[0]["tokens"], first.train[1]["tokens"])
    assert second.train.sample_identity(0)["tokens"] == first.train.sample_identity(1)["tokens"]
    assert second.train.sample_identity(0)["rows"] == "0"


KILLED_BUILD = """
import os, signal, sys
from epochal.data.sft import build_sft_datasets, load_chat_tokenizer
from epochal.data.sft import token_store

add, done = token_store.StoreWriter.add, []

def add_then_die(self, limited):
    add(self, limited)
    done.append(1)
    if len(done) == 50:  # a job killed half-way through tokenizing
        os.kill(os.getpid(), signal.SIGKILL)

token_store.StoreWriter.add = add_then_die
build_sft_datasets(sys.argv[1], load_chat_tokenizer(sys.argv[2]), seq_length=96,
                   split="90,10", packing=True, create_attention_mask=True, cache_dir=sys.argv[3])
"""


def test_a_killed_build_leaves_no_store_that_is_used(rows_file, tokenizer, reference, tmp_path):
    cache = tmp_path / "cache"
    code = textwrap.dedent(KILLED_BUILD)
    done = run_process(
        [sys.executable, "-c", code, str(rows_file), str(TOKENIZER_DIR), str(cache)], timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = list(cache.iterdir())
    assert left and all(p.name.startswith(".tmp-") for p in left)  # only the unfinished folder
    said = []
    built = _build(rows_file, tokenizer, cache, log=said.append)
    assert any("tokenizing once into" in line for line in said)
    _assert_same(built.train, reference[True][0])


def test_a_damaged_store_is_rebuilt_with_a_warning(rows_file, tokenizer, reference, tmp_path):
    cache = tmp_path / "cache"
    _build(rows_file, tokenizer, cache)
    store = next(cache.iterdir())
    tokens = store / "tokens.bin"
    with open(tokens, "r+b") as f:
        f.truncate(os.path.getsize(tokens) - 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = _build(rows_file, tokenizer, cache)
    assert any(issubclass(w.category, CacheRebuildWarning) for w in caught)
    _assert_same(built.train, reference[True][0])


def _rank(rank, world_size, path, cache):
    said = []
    built = build_sft_datasets(
        path,
        load_chat_tokenizer(TOKENIZER_DIR),
        seq_length=SEQ,
        split="90,10",
        packing=True,
        cache_dir=cache,
        log=said.append,
    )
    return said, [built.train[i]["tokens"].tolist() for i in range(len(built.train))]


@pytest.mark.distributed
def test_rank_zero_tokenizes_and_the_other_rank_waits_and_maps_the_store(rows_file, tmp_path):
    cache = str(tmp_path / "cache")
    (said0, samples0), (said1, samples1) = run_gloo(_rank, 2, str(rows_file), cache, timeout=180)
    assert any("tokenizing once into" in line for line in said0)
    assert len(said1) == 1 and "tokenized before, read from" in said1[0]
    assert samples0 == samples1
