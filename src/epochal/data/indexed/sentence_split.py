"""Sentence splitting for ``preprocess --split-sentences`` (Megatron's BERT data), offline.

:class:`SentenceSplitter` uses one of two engines, chosen once when it is built:

- ``"punkt"``: nltk's Punkt model for ``lang`` when its data is installed
  (``nltk.data.find("tokenizers/punkt_tab/<lang>/")`` or the older
  ``tokenizers/punkt/<lang>.pickle``) — what Megatron-LM's ``tools/preprocess_data.py``
  uses. With ``keep_newlines`` the whitespace after each sentence stays part of it (the
  period context of Megatron's ``CustomLanguageVars``). Nothing is downloaded.
- ``"rules"``: the built-in splitter, used when no Punkt data is found (or asked for with
  ``engine="rules"``). A sentence ends

  * after a run of ``.``, ``!``, ``?`` or ``…`` (with any closing quotes or brackets
    after it) that is followed by whitespace and then by a character that is not a
    lower-case letter, unless the run is a single ``.`` after a one-letter word (an
    initial: ``J. Smith``) or after a common abbreviation (``Mr``, ``Dr``, ``e.g``,
    ``etc``, ``Fig``, ``No``, ``Jan``, ... — :data:`ABBREVIATIONS`, case-insensitive);
  * at a blank line (a paragraph break), which Punkt would not split at.

  It is language-independent apart from the English abbreviations.

Both engines return sentences without the whitespace around them, or with
``keep_newlines`` each sentence followed by the whitespace up to the next one
(so that newlines survive tokenization). Whitespace-only pieces are dropped. As
Megatron's tool, text is split in pieces of at most 1,000,000 characters
(:data:`MAX_SPLIT_CHARS`), each on its own. The splitter is a pure function of the
text, so preprocessing output does not depend on the number of workers.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ABBREVIATIONS", "MAX_SPLIT_CHARS", "SentenceSplitter", "split_sentences"]

MAX_SPLIT_CHARS = 1_000_000

ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc e.g i.e cf al fig figs eq eqs no nos vol pp
    ca approx inc ltd co corp dept est gen gov lt col sgt capt rev ph.d u.s u.k jan feb mar
    apr jun jul aug sep sept oct nov dec""".split()
)

_END = re.compile(r"""[.!?…]+["'”’»)\]}]*(\s+)""")
_PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")


def _rule_boundaries(text: str) -> list[tuple[int, int]]:
    """``(end of sentence, start of the next)`` positions, in order."""
    found = []
    for match in _END.finditer(text):
        following = match.end()
        if following >= len(text) or text[following].islower():
            continue
        run = text[match.start() : match.start(1)]
        if run.rstrip("\"'”’»)]}") == ".":
            word_start = text.rfind(" ", 0, match.start()) + 1
            word_start = max(word_start, text.rfind("\n", 0, match.start()) + 1)
            word = text[word_start : match.start()].lstrip("\"'“‘«([{")
            if (len(word) == 1 and word.isalpha()) or word.lower() in ABBREVIATIONS:
                continue
        found.append((match.start(1), following))
    found.extend((m.start(), m.end()) for m in _PARAGRAPH.finditer(text))
    found.sort()
    merged: list[tuple[int, int]] = []
    for end, start in found:
        if merged and end < merged[-1][1]:  # inside the previous boundary's whitespace
            merged[-1] = (min(merged[-1][0], end), max(merged[-1][1], start))
        else:
            merged.append((end, start))
    return merged


def _punkt(lang: str, keep_newlines: bool) -> Any | None:
    """nltk's Punkt splitter for ``lang`` if nltk and its data are installed, else ``None``."""
    try:
        import nltk
        from nltk.tokenize import punkt
    except ImportError:
        return None
    params = None
    try:
        nltk.data.find(f"tokenizers/punkt_tab/{lang}/")
        params = punkt.PunktTokenizer(lang)._params
    except (LookupError, OSError, ValueError, AttributeError):
        try:
            path = nltk.data.find(f"tokenizers/punkt/{lang}.pickle")
            params = nltk.data.load(f"file:{path}")._params
        except (LookupError, OSError, ValueError, AttributeError):
            return None
    return _punkt_from_params(params, keep_newlines)


def _punkt_from_params(params: Any, keep_newlines: bool) -> Any:
    from nltk.tokenize import punkt

    if not keep_newlines:
        return punkt.PunktSentenceTokenizer(params)

    class KeepNewlines(punkt.PunktLanguageVars):
        # Punkt's period context, but the whitespace after a sentence end is optional and
        # consumed, so the newlines after a sentence stay in it (Megatron's CustomLanguageVars).
        _period_context_fmt = r"""
            \S*
            %(SentEndChars)s
            \s*
            (?=(?P<after_tok>
                %(NonWord)s
                |
                (?P<next_tok>\S+)
            ))"""

    return punkt.PunktSentenceTokenizer(params, lang_vars=KeepNewlines())


class SentenceSplitter:
    """Splits text into sentences (see the module docstring for the rules).

    Args:
        lang: Punkt's language name (Megatron's ``--lang``, default ``english``).
        keep_newlines: keep the whitespace after each sentence (Megatron's ``--keep-newlines``).
        engine: ``"auto"`` (Punkt when its data is installed, else the rules),
            ``"punkt"`` (error without its data) or ``"rules"``.

    Attributes:
        engine: the engine in use, ``"punkt"`` or ``"rules"``.

    Raises:
        ValueError: an unknown ``engine``, or ``engine="punkt"`` without nltk's Punkt data
            for ``lang`` (the message says what to install).
    """

    def __init__(self, lang: str = "english", keep_newlines: bool = False, engine: str = "auto"):
        if engine not in ("auto", "punkt", "rules"):
            raise ValueError(f"sentence splitter engine {engine!r} is not auto, punkt or rules")
        self.lang = lang
        self.keep_newlines = keep_newlines
        self._requested = engine
        self._build()

    def _build(self) -> None:
        self._punkt = None if self._requested == "rules" else _punkt(self.lang, self.keep_newlines)
        if self._punkt is None and self._requested == "punkt":
            raise ValueError(
                f"--lang {self.lang}: nltk's Punkt data for {self.lang!r} is not installed "
                "(python -m nltk.downloader punkt_tab), or use the built-in splitter"
            )
        self.engine = "punkt" if self._punkt is not None else "rules"

    def __getstate__(self) -> dict[str, Any]:
        return {"lang": self.lang, "keep_newlines": self.keep_newlines, "engine": self._requested}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.lang, self.keep_newlines = state["lang"], state["keep_newlines"]
        self._requested = state["engine"]
        self._build()

    def __repr__(self) -> str:
        newlines = ", keep_newlines" if self.keep_newlines else ""
        return f"SentenceSplitter({self.engine}, {self.lang}{newlines})"

    def tokenize(self, text: str) -> list[str]:
        """The sentences of ``text`` (Megatron's name for this method)."""
        sentences: list[str] = []
        for start in range(0, len(text), MAX_SPLIT_CHARS):
            sentences.extend(self._split(text[start : start + MAX_SPLIT_CHARS]))
        return sentences

    __call__ = tokenize

    def _split(self, text: str) -> list[str]:
        if self._punkt is not None:
            return [s for s in self._punkt.tokenize(text) if s.strip()]
        pieces, begin = [], 0
        for end, following in _rule_boundaries(text):
            pieces.append(text[begin : following if self.keep_newlines else end])
            begin = following
        pieces.append(text[begin:])
        if self.keep_newlines:
            return [p.lstrip() if i == 0 else p for i, p in enumerate(pieces) if p.strip()]
        return [p.strip() for p in pieces if p.strip()]


def split_sentences(text: str, lang: str = "english", keep_newlines: bool = False) -> list[str]:
    """``SentenceSplitter(lang, keep_newlines).tokenize(text)`` (build the splitter once for many texts)."""
    return SentenceSplitter(lang, keep_newlines).tokenize(text)
