"""Chat rows and a chat tokenizer shipped with the package (the ``sft-tiny`` preset's data).

- ``tiny_chat.jsonl``: 160 short conversations (``messages`` rows: an optional system
  prompt, one or two user / assistant turns about arithmetic, weekdays, opposites,
  colours, capitals and counting), generated from templates with a fixed seed.
- ``tokenizer/``: a 512-id byte-level BPE tokenizer trained on those rows' text
  (``tokenizers``), with ``<s>`` (BOS), ``<|eot|>`` (end of turn and EOS), ``<pad>``
  and a chat template that marks the assistant turns with ``{% generation %}``, as
  TRL's training templates do; load it with ``transformers.AutoTokenizer``.

:data:`CHAT_FILE` and :data:`TOKENIZER_DIR` are their paths.
"""

from pathlib import Path

__all__ = ["CHAT_FILE", "TOKENIZER_DIR"]

#: the example chat rows (JSONL, one ``{"messages": [...]}`` a line)
CHAT_FILE = Path(__file__).with_name("tiny_chat.jsonl")
#: the example tokenizer's folder (``tokenizer.json``, ``tokenizer_config.json``)
TOKENIZER_DIR = Path(__file__).with_name("tokenizer")
