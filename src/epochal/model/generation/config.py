"""Options and result of :func:`~epochal.model.generation.decoding.generate`."""

from __future__ import annotations

from dataclasses import dataclass, field


class GenerationConfigError(ValueError):
    """An invalid generation option; the message starts with the option name."""


@dataclass(kw_only=True)
class GenerationConfig:
    """Options of :func:`generate`.

    Attributes:
        max_new_tokens: tokens to generate per prompt (>= 0).
        do_sample: sample instead of greedy / beam search.
        temperature: logits are divided by it when sampling (> 0).
        top_k: keep the ``top_k`` most likely tokens when sampling (0 = off).
        top_p: nucleus sampling threshold in [0, 1] (0 or 1 = off).
        top_p_decay: multiply ``top_p`` by this after every step, in [0, 1] (0 = off).
        top_p_bound: lower bound of the decayed ``top_p``, in [0, 1] (0 = none).
        num_beams: beam search when > 1.
        length_penalty: beam hypotheses are scored ``sum_logprobs / length ** length_penalty``.
        early_stopping: beam search stop rule (see the module docstring).
        num_return_sequences: best beam hypotheses returned per prompt (<= num_beams).
        stop_token_ids: token ids that end a row (e.g. the tokenizer's EOD/EOS).
        pad_token_id: id used to pad finished rows inside the batch (default: the
            first stop token, else 0). Never appears in the returned lists.
        add_bos: prepend ``bos_token_id`` to every prompt.
        bos_token_id: the BOS id (required with ``add_bos``).
        seed: seed of the per-row sampling generators.
        vocab_size: number of real token ids; ids ``>= vocab_size`` are never
            produced (default: ``model.config.vocab_size``).
        decoder_start_token_id: encoder-decoder models: the decoder's first token
            (default: ``model.config.pad_token_id``, else 0 — T5's pad id).
    """

    max_new_tokens: int = 32
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    top_p_decay: float = 0.0
    top_p_bound: float = 0.0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = False
    num_return_sequences: int = 1
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    pad_token_id: int | None = None
    add_bos: bool = False
    bos_token_id: int | None = None
    seed: int = 0
    vocab_size: int | None = None
    decoder_start_token_id: int | None = None

    def __post_init__(self) -> None:
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.validate()

    def validate(self) -> None:
        """Raise :class:`GenerationConfigError` naming the first invalid option."""

        def need(cond: bool, option: str, message: str) -> None:
            if not cond:
                raise GenerationConfigError(f"{option}: {message}")

        need(self.max_new_tokens >= 0, "max_new_tokens", f"must be >= 0, got {self.max_new_tokens}")
        need(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        need(self.top_k >= 0, "top_k", f"must be >= 0 (0 = off), got {self.top_k}")
        need(
            0.0 <= self.top_p <= 1.0, "top_p", f"must be in [0, 1] (0 or 1 = off), got {self.top_p}"
        )
        need(
            0.0 <= self.top_p_decay <= 1.0,
            "top_p_decay",
            f"must be in [0, 1], got {self.top_p_decay}",
        )
        need(
            0.0 <= self.top_p_bound <= 1.0,
            "top_p_bound",
            f"must be in [0, 1], got {self.top_p_bound}",
        )
        need(self.num_beams >= 1, "num_beams", f"must be >= 1, got {self.num_beams}")
        need(
            not (self.do_sample and self.num_beams > 1),
            "num_beams",
            "beam search with do_sample=True is not supported; use one or the other",
        )
        need(
            1 <= self.num_return_sequences <= self.num_beams,
            "num_return_sequences",
            f"must be in [1, num_beams={self.num_beams}], got {self.num_return_sequences}",
        )
        need(
            not self.add_bos or self.bos_token_id is not None,
            "bos_token_id",
            "must be set when add_bos is true",
        )
        need(
            self.vocab_size is None or self.vocab_size >= 1,
            "vocab_size",
            f"must be >= 1, got {self.vocab_size}",
        )


@dataclass
class GenerationOutput:
    """Result of :func:`generate`, one entry per returned sequence.

    With beam search, prompt ``i``'s hypotheses are entries
    ``i * num_return_sequences ... (i + 1) * num_return_sequences - 1``, best first.

    Attributes:
        sequences: prompt (with BOS if added) followed by the generated tokens.
        tokens: the generated tokens only (ending with the stop token if one was produced).
        prompt_lengths: length of each entry's prompt (BOS included).
        finished: whether the entry ended with a stop token.
        scores: beam search only: each hypothesis' length-normalized log-probability.
    """

    sequences: list[list[int]]
    tokens: list[list[int]]
    prompt_lengths: list[int]
    finished: list[bool]
    scores: list[float] | None = None
