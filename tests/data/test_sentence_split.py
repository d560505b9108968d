"""Sentence splitting and ``preprocess --split-sentences`` (Megatron's BERT data layout)."""

import json
import pickle

import numpy as np
import pytest

from epochal.cli import main
from epochal.data import (
    IndexedDataset,
    SentenceSplitter,
    build_tokenizer,
    preprocess_documents,
    split_sentences,
)
from epochal.data.indexed.indexed_format import get_bin_path, get_idx_path
from epochal.data.indexed.preprocess import preprocess
from epochal.data.indexed.sentence_split import MAX_SPLIT_CHARS, _punkt_from_params

TEXT = (
    'Mr. Smith went to Washington. He said "Hi!" Then he left... and came back? Yes. '
    "J. R. R. Tolkien wrote e.g. books. Version 3.14 is out. The end.\n\n"
    "New paragraph here\nwith a line break\n\n\nlast one"
)
SENTENCES = [
    "Mr. Smith went to Washington.",
    'He said "Hi!"',
    "Then he left... and came back?",
    "Yes.",
    "J. R. R. Tolkien wrote e.g. books.",
    "Version 3.14 is out.",
    "The end.",
    "New paragraph here\nwith a line break",
    "last one",
]


def test_rule_splitter_sentences_and_newlines():
    splitter = SentenceSplitter(engine="rules")
    assert splitter.engine == "rules" and splitter.tokenize(TEXT) == SENTENCES
    assert split_sentences("  one.  Two!  ") == ["one.", "Two!"]
    assert split_sentences("") == [] and split_sentences(" \n\n ") == []
    kept = SentenceSplitter(keep_newlines=True, engine="rules").tokenize(TEXT)
    assert "".join(kept) == TEXT  # nothing lost: the whitespace after each sentence stays in it
    assert [s.strip() for s in kept] == SENTENCES and kept[6] == "The end.\n\n"
    clone = pickle.loads(pickle.dumps(splitter))
    assert clone.tokenize(TEXT) == SENTENCES and "rules" in repr(clone)
    with pytest.raises(ValueError, match="engine"):
        SentenceSplitter(engine="spacy")


def test_text_is_split_in_megatron_sized_pieces():
    sentence = "A" * (MAX_SPLIT_CHARS - 3) + ". B"  # the 1M-char cut falls inside "B C."
    pieces = split_sentences(sentence + " C.")
    assert pieces == ["A" * (MAX_SPLIT_CHARS - 3) + ".", "B", "C."]
    long = "x" * (MAX_SPLIT_CHARS + 10)
    assert split_sentences(long) == ["x" * MAX_SPLIT_CHARS, "x" * 10]


def test_punkt_engine_with_megatron_keep_newlines():
    """The Punkt path (used when nltk's data is installed), on untrained parameters."""
    punkt = pytest.importorskip("nltk.tokenize.punkt")
    PunktParameters = punkt.PunktParameters

    plain = _punkt_from_params(PunktParameters(), keep_newlines=False)
    kept = _punkt_from_params(PunktParameters(), keep_newlines=True)
    text = "First one. Second one.\n\nThird one."
    assert plain.tokenize(text) == ["First one.", "Second one.", "Third one."]
    assert kept.tokenize(text) == ["First one. ", "Second one.\n\n", "Third one."]


def test_punkt_is_used_when_its_data_is_installed(tmp_path, monkeypatch):
    """A (tiny) punkt_tab folder on nltk's data path: the auto engine picks Punkt for --lang."""
    nltk = pytest.importorskip("nltk")
    folder = tmp_path / "tokenizers" / "punkt_tab" / "testlang"
    folder.mkdir(parents=True)
    (folder / "abbrev_types.txt").write_text("mr\ndr\n")
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (folder / name).write_text("")
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])
    text = "Mr. Smith left. Dr. Who came.\n\nNext one."
    splitter = SentenceSplitter("testlang")
    assert splitter.engine == "punkt"
    assert splitter.tokenize(text) == ["Mr. Smith left.", "Dr. Who came.", "Next one."]
    kept = pickle.loads(pickle.dumps(SentenceSplitter("testlang", keep_newlines=True)))
    assert kept.engine == "punkt"
    assert kept.tokenize(text) == ["Mr. Smith left. ", "Dr. Who came.\n\n", "Next one."]


def test_punkt_requested_without_data_is_a_clear_error():
    nltk = pytest.importorskip("nltk")
    try:
        nltk.data.find("tokenizers/punkt_tab/klingon/")
    except LookupError:
        with pytest.raises(ValueError, match="--lang klingon.*not installed"):
            SentenceSplitter("klingon", engine="punkt")
    assert SentenceSplitter("klingon").engine == "rules"  # auto falls back, offline


RECORDS = [
    {"text": TEXT},
    {"text": ""},
    {"text": "One sentence only"},
    {"text": ["Pre split. Into two.", "Third part!"]},
] + [{"text": f"Doc {i}. " + "It has words. " * (i % 7) + "End."} for i in range(80)]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps(record) + "\n")
    return str(path)


def file_bytes(prefix):
    with open(get_bin_path(prefix), "rb") as data, open(get_idx_path(prefix), "rb") as index:
        return data.read(), index.read()


def test_split_sentences_layout_and_workers(tmp_path):
    tok = build_tokenizer("gpt2")
    path = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    one = preprocess(path, tmp_path / "one", tok, split_sentences=True, append_eod=True)
    assert one.outputs == {"text": f"{tmp_path}/one_text_sentence"}
    assert one.sentence_splitter.startswith("SentenceSplitter(")
    two = preprocess(
        path,
        tmp_path / "two",
        tok,
        split_sentences=True,
        append_eod=True,
        workers=2,
        chunk_bytes=300,
    )
    assert file_bytes(one.outputs["text"]) == file_bytes(two.outputs["text"])
    splitter = SentenceSplitter()
    ds = IndexedDataset(one.outputs["text"])
    expected = []
    for record in RECORDS:
        texts = [record["text"]] if isinstance(record["text"], str) else record["text"]
        sentences = [tok.encode(s) for t in texts for s in splitter.tokenize(t)]
        sentences = [s for s in sentences if s]
        if sentences:
            sentences[-1] = sentences[-1] + [tok.eod]  # --append-eod: the last sentence only
        expected.append(sentences)
    assert [x.tolist() for x in ds] == [s for d in expected for s in d]
    np.testing.assert_array_equal(ds.document_indices, np.cumsum([0] + [len(d) for d in expected]))
    assert len(expected[0]) == len(SENTENCES) and len(expected[1]) == 0
    in_memory = preprocess_documents(
        [r["text"] for r in RECORDS], tok, tmp_path / "docs", split_sentences=True
    )
    assert in_memory.sentence_splitter == one.sentence_splitter
    assert file_bytes(str(tmp_path / "docs")) == file_bytes(one.outputs["text"])


@pytest.mark.peer
def test_split_sentences_equals_megatron_flow(tmp_path):
    """Megatron's preprocess_data.py flow (split, then encode each sentence, add_document with
    the sentence lengths) on Megatron-Core's builder, with the same splitter: same bytes."""
    import warnings

    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    tok = build_tokenizer("gpt2")
    records = [r for r in RECORDS if isinstance(r["text"], str)]
    path = write_jsonl(tmp_path / "in.jsonl", records)
    splitter = SentenceSplitter(keep_newlines=True)
    prefix = str(tmp_path / "meg_text_sentence")
    builder = megatron.IndexedDatasetBuilder(
        prefix + ".bin", dtype=megatron.DType.optimal_dtype(tok.vocab_size)
    )
    with open(path, encoding="utf-8") as stream:
        for line in stream:
            ids, lens = [], []
            for sentence in splitter.tokenize(json.loads(line)["text"]):
                sentence_ids = tok.encode(sentence)
                if sentence_ids:
                    ids.extend(sentence_ids)
                    lens.append(len(sentence_ids))
            if ids:
                ids.append(tok.eod)
                lens[-1] += 1
            builder.add_document(torch.tensor(ids, dtype=torch.int64), lens)
    builder.finalize(prefix + ".idx")
    ours = preprocess(
        path,
        tmp_path / "ours",
        tok,
        split_sentences=True,
        keep_newlines=True,
        append_eod=True,
        workers=2,
        chunk_bytes=500,
    )
    assert file_bytes(ours.outputs["text"]) == file_bytes(prefix)


def test_cli_bert_split_sentences(tmp_path, capsys):
    from epochal.data import train_wordpiece

    path = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    vocab = train_wordpiece(
        [r["text"] for r in RECORDS if isinstance(r["text"], str)], 200, tmp_path
    )
    args = ["preprocess", "--input", path, "--tokenizer-type", "BertWordPieceLowerCase"]
    args += ["--vocab-file", vocab, "--output-prefix", str(tmp_path / "bert"), "--no-progress"]
    assert main([*args, "--split-sentences", "--lang", "english", "--workers", "2"]) == 0
    out = capsys.readouterr()
    assert "sentences split by SentenceSplitter" in out.err and "bert_text_sentence" in out.out
    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=vocab)
    ds = IndexedDataset(str(tmp_path / "bert_text_sentence"))
    assert ds[0].tolist() == tok.encode(SENTENCES[0])
    assert ds.document_indices[1] == len(SENTENCES)
