"""Encoder tokenizers: BERT WordPiece (Megatron's BertWordPiece*), offline WordPiece training,
ESM-2's protein alphabet; peers: transformers' BertTokenizer (and its Python legacy class), EsmTokenizer."""

import os
import pickle
import sysconfig
from pathlib import Path

import pytest

from epochal.data import (
    BertWordPieceTokenizer,
    ESM2Tokenizer,
    build_tokenizer,
    train_wordpiece,
)
from epochal.data.indexed.tokenizer import TokenizerFileError
from epochal.data.indexed.tokenizer_esm import ESM2_ALPHABET
from tests.data.esm_vocab import ESM2_VOCAB_TXT, REAL_PROTEINS

TEXTS = [
    "Hello World!",
    "Héllo Wörld! ÜNÏCODE café naïve RÉSUMÉ",
    "a [MASK] b [SEP] [mask] [CLS]x",
    "x\u0000y\u200bz \t\n tab\r\nend",
    "中文字符 and 日本語 mixed",
    "def f(x):\n    return x ** 2  # comment",
    "x" * 150,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "",
    "   ",
    "don't I'm we've 3.14159 1,000,000",
    "🙂 emoji ﬁ ligature Ⅻ ǅ",
]


def corpus() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(root.glob("*.py"))[:12]]


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wordpiece")
    docs = corpus() + TEXTS
    return {
        lower: train_wordpiece(docs, 1200, folder / f"vocab-{lower}.txt", lowercase=lower)
        for lower in (True, False)
    }


def test_train_wordpiece_is_deterministic_and_bert_shaped(tmp_path, vocabs):
    again = train_wordpiece(corpus() + TEXTS, 1200, tmp_path, lowercase=True)
    assert again == str(tmp_path / "vocab.txt")
    text = Path(vocabs[True]).read_text(encoding="utf-8")
    assert Path(again).read_text(encoding="utf-8") == text
    tokens = text.splitlines()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(tokens) == 1200 and len(set(tokens)) == 1200
    assert any(t.startswith("##") and len(t) > 3 for t in tokens)  # continuation merges
    assert "return" in tokens and "Return" not in tokens  # lower-cased
    assert "[" in tokens and all("\U000f0000" > c for t in tokens for c in t)  # no stand-ins left
    cased = Path(vocabs[False]).read_text(encoding="utf-8").splitlines()
    assert "None" in cased and cased != tokens
    with pytest.raises(ValueError, match="special tokens"):
        train_wordpiece(["a b"], 5, tmp_path / "v.txt")


@pytest.mark.parametrize("lower", [True, False])
def test_bert_wordpiece_attributes_and_roundtrip(vocabs, lower):
    name = "BertWordPieceLowerCase" if lower else "BertWordPieceCase"
    tok = build_tokenizer(name, vocab_file=vocabs[lower])
    assert isinstance(tok, BertWordPieceTokenizer) and tok.lower_case is lower
    assert (tok.pad, tok.unk, tok.cls, tok.sep, tok.mask) == (0, 1, 2, 3, 4)
    assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id) == (2, 3, 0, 4)
    # Megatron appends [BOS] and [EOS] to a vocabulary without them; eod is [EOS]
    assert (tok.bos, tok.eos, tok.eod, tok.vocab_size) == (1200, 1201, 1201, 1202)
    assert tok.inv_vocab[tok.mask] == "[MASK]" and tok.vocab["[EOS]"] == tok.eos
    assert all(tok.vocab[t] == i for i, t in tok.inv_vocab.items())
    assert tok.unique_identifiers == {
        "class": name,
        "tokenizer_path": [str(vocabs[lower])],
        "vocab_extra_ids": "0",
    }
    ids = tok.tokenize("Hello World, tokenization!")
    assert ids == tok.encode("Hello World, tokenization!")
    words = "hello world , tokenization !" if lower else "Hello World , tokenization !"
    assert tok.detokenize(ids) == tok.decode(ids) == words
    assert tok.decode_token_ids([tok.cls, *ids, tok.pad]) == " " + words
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    assert clone.vocab == tok.vocab and clone.mask == tok.mask


@pytest.mark.peer
@pytest.mark.parametrize("lower", [True, False])
def test_bert_wordpiece_ids_equal_transformers(vocabs, lower):
    transformers = pytest.importorskip("transformers")
    from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

    tok = BertWordPieceTokenizer(vocabs[lower], lower_case=lower)
    references = [
        transformers.BertTokenizer(vocabs[lower], do_lower_case=lower),
        BertTokenizerLegacy(vocabs[lower], do_lower_case=lower),  # the Python original
    ]
    texts = TEXTS + corpus()[:4]
    ours = tok.encode_batch(texts)
    for reference in references:
        assert reference.convert_tokens_to_ids("[MASK]") == tok.mask
        for text, ids in zip(texts, ours):
            assert ids == reference.encode(text, add_special_tokens=False), text[:40]
    assert sum(map(len, ours)) > 1000


def test_bert_wordpiece_bad_vocabularies(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.txt"):
        build_tokenizer("BertWordPieceLowerCase", vocab_file=tmp_path / "no-such.txt")
    with pytest.raises(ValueError, match="needs --vocab-file"):
        build_tokenizer("BertWordPieceCase")
    for missing in ("[MASK]", "[CLS]", "[SEP]", "[PAD]"):
        path = tmp_path / "vocab.txt"
        tokens = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a") if t != missing]
        path.write_text("\n".join(tokens) + "\n")
        with pytest.raises(TokenizerFileError, match=rf"{path}.*no \[{missing[1:-1]}\]"):
            build_tokenizer("BertWordPieceLowerCase", vocab_file=path)
    (tmp_path / "dup.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n[PAD]\n")
    with pytest.raises(TokenizerFileError, match=r"dup.txt:6.*repeats line 1"):
        BertWordPieceTokenizer(tmp_path / "dup.txt")


PROTEINS = [
    "MKTAYIAKQRQISFVKSHFSRQ",
    "MK TA\nYI",
    "mkta",
    "MK<mask>TA<cls><eos>",
    "ACDJ",
    "",
    "<null_1>A-.BUZOX",
    "M<unk>K<pad>",
    "MK<maskX",
    "<<mask>>",
]


def test_esm2_tokenizer_alphabet_and_specials(tmp_path):
    tok = build_tokenizer("ESM2Tokenizer")
    assert isinstance(tok, ESM2Tokenizer) and build_tokenizer("EsmTokenizer").vocab == tok.vocab
    assert tok.vocab_size == 33 and [tok.inv_vocab[i] for i in range(33)] == ESM2_ALPHABET
    assert (tok.cls, tok.pad, tok.eos, tok.unk, tok.mask, tok.eod, tok.bos) == (
        0,
        1,
        2,
        3,
        32,
        2,
        0,
    )
    assert tok.encode("MKT<mask>") == [20, 15, 11, 32] and tok.tokenize("mkta") == [3]
    assert tok.decode([0, 20, 32, 2]) == "<cls> M <mask> <eos>"
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode_batch(PROTEINS) == [tok.encode(p) for p in PROTEINS]
    (tmp_path / "bad.txt").write_text("<cls>\n<pad>\n<eos>\nA\n")
    with pytest.raises(TokenizerFileError, match=r"bad.txt.*no <unk>"):
        build_tokenizer("esm", vocab_file=tmp_path / "bad.txt")


def test_esm2_alphabet_is_fair_esm_order():
    """Isoleucine is 12 and aspartate 13 (``... R T I D P K ...``), as in ESM-2's vocab.txt."""
    tok = build_tokenizer("esm")
    assert [tok.inv_vocab[i] for i in range(33)] == ESM2_VOCAB_TXT.split()
    assert (tok.vocab["I"], tok.vocab["D"], tok.vocab["R"], tok.vocab["P"]) == (12, 13, 10, 14)
    assert tok.encode("MQIFVKTLTGKTITLEVEPSD") == [
        20, 16, 12, 18, 7, 15, 11, 4, 11, 6, 15, 11, 12, 11, 4, 9, 7, 9, 14, 8, 13
    ]  # fmt: skip


@pytest.mark.peer
def test_esm2_ids_equal_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text(ESM2_VOCAB_TXT)
    reference = transformers.EsmTokenizer(str(vocab))
    ours = build_tokenizer("esm")
    assert ours.vocab == build_tokenizer("esm", vocab_file=vocab).vocab == reference.get_vocab()
    for text in PROTEINS + REAL_PROTEINS:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False), text
        with_specials = reference.encode(text)
        assert with_specials == [ours.cls, *ids, ours.eos]
        assert ours.decode(with_specials) == reference.decode(with_specials)
    assert (reference.mask_token_id, reference.pad_token_id) == (ours.mask, ours.pad)
    assert sorted(reference.all_special_ids) == sorted(
        {ours.cls, ours.pad, ours.eos, ours.unk, ours.mask}
    )


def test_t5_unigram_tokenizer_json_matches_t5_tokenizer_fast(tmp_path):
    """A SentencePiece-style Unigram tokenizer.json (T5's kind), trained offline, read as
    HuggingFaceTokenizer: the ids of transformers' T5TokenizerFast, sentinels in order."""
    import glob
    import json as json_module

    transformers = pytest.importorskip("transformers")
    from tokenizers import SentencePieceUnigramTokenizer

    from epochal.data.indexed.tokenizer import HuggingFaceTokenizer

    docs = [
        open(f).read() for f in sorted(glob.glob(os.path.dirname(json_module.__file__) + "/*.py"))
    ]
    unigram = SentencePieceUnigramTokenizer()
    specials = ["<pad>", "</s>", "<unk>"] + [f"<extra_id_{i}>" for i in range(99, -1, -1)]
    unigram.train_from_iterator(
        docs, vocab_size=600, special_tokens=specials, unk_token="<unk>", show_progress=False
    )
    path = tmp_path / "tokenizer.json"
    unigram.save(str(path))
    ours = HuggingFaceTokenizer(path)
    reference = transformers.T5TokenizerFast(tokenizer_file=str(path), extra_ids=0)
    text = "def encode(obj):\n    return json.dumps(obj, indent=2) <extra_id_0> tail"
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)
    assert ours.eod == ours.eos == reference.convert_tokens_to_ids("</s>")
    assert ours.pad == reference.convert_tokens_to_ids("<pad>")
    sentinels = ours.additional_special_tokens_ids
    assert len(sentinels) == 100
    assert sentinels == reference.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(100)])


@pytest.mark.peer
def test_esm2_hf_tokenizer_files_load_as_esm_tokenizer(tmp_path):
    """The files an ESM export ships: AutoTokenizer reads them as ESM-2's EsmTokenizer."""
    transformers = pytest.importorskip("transformers")
    ours = build_tokenizer("esm")
    for name, text in ours.hf_tokenizer_files().items():
        (tmp_path / name).write_text(text)
    assert (tmp_path / "vocab.txt").read_text() == ESM2_VOCAB_TXT
    loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(loaded).__name__ == "EsmTokenizer"
    for text in REAL_PROTEINS + ["MK<mask>TA"]:
        assert loaded.encode(text) == [ours.cls, *ours.encode(text), ours.eos]
    ids = loaded.encode(REAL_PROTEINS[0])
    assert ours.convert_ids_to_tokens(ids) == loaded.convert_ids_to_tokens(ids)
    assert (loaded.mask_token_id, loaded.pad_token_id, loaded.cls_token_id) == (32, 1, 0)
