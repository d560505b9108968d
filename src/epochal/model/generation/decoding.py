"""Text generation with a KV cache: greedy, sampling (temperature / top-k / top-p) and beam search.

``generate(model, prompts, GenerationConfig(...))`` works on any module with
:class:`~epochal.model.GPTModel`'s ``forward(tokens, position_ids,
attention_mask, kv_cache=..., logits_to_keep=...)`` signature, on one process or
with tensor parallelism applied from outside (every rank runs the same call with
the same prompts; sharded logits that are DTensors are gathered with
``full_tensor()``). The model is put in eval mode for the call and restored.

Batches of prompts of different lengths are left-padded: each row gets its own
positions (``0`` at its first real token) and a mask that hides its padding, so
a prompt generates the same tokens alone or in a batch (up to floating-point
summation order). The model's padded vocabulary rows (ids ``>= vocab_size``)
are never produced: their logits are dropped before any choice.

Decoding strategies (semantics of Megatron-LM's text generation and of
Hugging Face ``generate``):

- greedy (``do_sample=False, num_beams=1``): argmax at every step;
- sampling (``do_sample=True``): logits / ``temperature``, then top-k (``top_k > 0``)
  and top-p (``0 < top_p < 1``: keep the smallest set of most likely tokens whose
  probability reaches ``top_p``) filtering, then a draw. After every step
  ``top_p *= top_p_decay`` (if ``top_p_decay > 0``), floored at ``top_p_bound``
  (if > 0), as Megatron's ``--top_p_decay``/``--top_p_bound``. Unlike Megatron,
  top-k and top-p may be combined (top-k applies first, as in Hugging Face).
  Row ``i`` of a batch draws from its own ``torch.Generator`` seeded from
  ``(seed, i)``, so results do not depend on the global RNG, and the first prompt
  of a batch samples what it samples alone with the same seed;
- beam search (``num_beams > 1``): Hugging Face's algorithm (transformers 4.50+,
  same results): at each step the ``2 * num_beams`` (more with several stop
  tokens) best continuations by summed log-probability are kept, those ending
  in a stop token become finished hypotheses scored
  ``sum_logprobs / generated_length ** length_penalty``, the best
  ``num_beams`` others continue; ``early_stopping`` as in Hugging Face
  (``False``: stop when no running beam can beat the worst finished one at its
  current length; ``True``: stop when ``num_beams`` hypotheses are finished).

The stop token(s) end a row (the stop token is part of the output); ``add_bos``
prepends ``bos_token_id`` to every prompt (Megatron's ``add_BOS``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from epochal.model.generation.kv_cache import KVCache

__all__ = [
    "GenerationConfig",
    "GenerationConfigError",
    "GenerationOutput",
    "candidates",
    "filter_logits",
    "generate",
]

_NEG = -1.0e9


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


def filter_logits(logits: torch.Tensor, *, top_k: int = 0, top_p: float = 0.0) -> torch.Tensor:
    """Set the logits outside the top-k / top-p set to ``-inf`` (a filtered copy).

    Args:
        logits: float ``[b, vocab]`` (already divided by the temperature).
        top_k: keep the ``top_k`` largest per row (0 = off; ties at the k-th value are kept).
        top_p: keep the smallest prefix of the descending-probability order whose
            total probability reaches ``top_p`` (0 or 1 = off); the most likely token is
            always kept.

    Returns:
        ``[b, vocab]``.
    """
    logits = logits.clone()
    if top_k > 0:
        k = min(top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits.masked_fill_(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative > top_p
        remove[:, 1:] = remove[:, :-1].clone()  # keep the token that crosses the threshold
        remove[:, 0] = False
        logits.scatter_(1, order, sorted_logits.masked_fill(remove, float("-inf")))
    return logits


def candidates(
    logits: torch.Tensor, *, top_k: int = 0, top_p: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling distribution of ``logits`` after top-k / top-p filtering, over sorted candidates.

    Equals ``softmax(filter_logits(logits, top_k=top_k, top_p=top_p))`` scattered to
    ``order`` (up to normalization), but only the candidates are materialized:
    the ``top_k`` largest logits, or for top-p alone the 1024 most likely tokens
    when they hold at least ``top_p`` of the probability in every row (the
    nucleus is a prefix of the sorted order), else the whole sorted row.

    Args:
        logits: float ``[b, V]`` (already divided by the temperature).

    Returns:
        ``(probs, order)``: ``[b, n]`` non-negative weights (not normalized) and the
        token ids they belong to, most likely first.
    """
    if top_p >= 1.0:  # keeps everything (float32 cumulative sums pass 1.0 early)
        top_p = 0.0
    if top_k > 0:
        values, order = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)  # descending
        probs = values.softmax(dim=-1)
    elif top_p > 0.0:
        full = logits.softmax(dim=-1)
        probs, order = torch.topk(full, min(1024, full.shape[-1]), dim=-1)
        if not bool((probs.sum(dim=-1) >= top_p).all()):
            probs, order = torch.sort(full, dim=-1, descending=True)
    else:
        probs = logits.softmax(dim=-1)
        order = torch.arange(logits.shape[-1], device=logits.device).expand_as(logits)
        return probs, order
    if top_p > 0.0:
        remove = probs.cumsum(dim=-1) > top_p
        remove[:, 1:] = remove[:, :-1].clone()  # keep the token that crosses the threshold
        remove[:, 0] = False
        probs = probs.masked_fill(remove, 0.0)
    return probs, order


def _sample(
    logits: torch.Tensor, top_k: int, top_p: float, generators: list[torch.Generator]
) -> torch.Tensor:
    """One draw per row from :func:`candidates` (row ``i`` uses ``generators[i]``)."""
    probs, order = candidates(logits, top_k=top_k, top_p=top_p)
    return torch.gather(order, 1, _draw(probs, generators)[:, None]).squeeze(1)


def _draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Inverse-CDF draw: row ``i`` takes one uniform number from ``generators[i]``.

    ``probs`` is ``[b, n]``, non-negative (rows need not sum to 1; zeros are never
    drawn). Returns int64 ``[b]``.
    """
    cdf = probs.double().cumsum(dim=-1)
    u = torch.cat(
        [torch.rand(1, generator=g, dtype=torch.float64, device=g.device) for g in generators]
    )
    u = (u * cdf[:, -1]).to(cdf.device)[:, None]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


def _row_seed(seed: int, row: int) -> int:
    digest = hashlib.sha256(f"epochal-generate/{int(seed)}/{row}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class _Batch:
    """Left-padded prompts with per-row positions and key masks for ``total`` slots."""

    def __init__(
        self, prompts: Sequence[Sequence[int]], total_new: int, pad_id: int, device: torch.device
    ):
        lengths = [len(p) for p in prompts]
        self.prompt_len = max(lengths)
        self.total = self.prompt_len + total_new
        b = len(prompts)
        tokens = torch.full((b, self.prompt_len), pad_id, dtype=torch.long)
        for i, p in enumerate(prompts):
            if lengths[i]:
                tokens[i, self.prompt_len - lengths[i] :] = torch.as_tensor(
                    list(p), dtype=torch.long
                )
        self.tokens = tokens.to(device)
        pads = torch.tensor([self.prompt_len - n for n in lengths], device=device)
        slots = torch.arange(self.total, device=device)
        self.valid = slots[None, :] >= pads[:, None]  # [b, total]
        self.positions = (slots[None, :] - pads[:, None]).clamp(min=0)  # [b, total]
        self.padded = bool((pads > 0).any())

    def expand(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (beam expansion)."""
        self.valid = self.valid[index]
        self.positions = self.positions[index]

    def prefill_mask(self) -> torch.Tensor | None:
        if not self.padded:
            return None
        s = self.prompt_len
        mask = ~self.valid[:, None, None, :s].expand(-1, 1, s, s)
        eye = torch.eye(s, dtype=torch.bool, device=mask.device)
        return mask & ~eye  # padding queries attend to themselves (keeps them finite)

    def step_mask(self, end: int) -> torch.Tensor | None:
        if not self.padded:
            return None
        return ~self.valid[:, None, None, :end]


def _logits(model: nn.Module, tokens, positions, mask, cache, keep_last: bool) -> torch.Tensor:
    out = model(
        tokens,
        position_ids=positions,
        attention_mask=mask,
        kv_cache=cache,
        logits_to_keep=1 if keep_last else None,
    )
    if hasattr(out, "full_tensor"):  # a sharded DTensor under tensor parallelism
        out = out.full_tensor()
    return out[:, -1].float()


def _prepare(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    cfg: GenerationConfig,
    *,
    check_positions: bool = True,
) -> tuple[list[list[int]], int, int]:
    model_cfg = getattr(model, "config", None)
    vocab = cfg.vocab_size or getattr(model_cfg, "vocab_size", None)
    if vocab is None:
        raise GenerationConfigError("vocab_size: the model has no config.vocab_size; set it")
    padded_vocab = getattr(model_cfg, "padded_vocab_size", vocab)
    if vocab > padded_vocab:
        raise GenerationConfigError(
            f"vocab_size: {vocab} exceeds the model's {padded_vocab} output rows"
        )
    max_positions = getattr(model_cfg, "max_position_embeddings", None)
    if len(prompts) == 0:
        raise GenerationConfigError("prompts: need at least one prompt")
    rows: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        ids = [int(t) for t in prompt]
        if cfg.add_bos:
            ids = [int(cfg.bos_token_id)] + ids
        if not ids:
            raise GenerationConfigError(
                f"prompts[{i}]: empty prompt (set add_bos or give at least one token)"
            )
        bad = [t for t in ids if not 0 <= t < padded_vocab]
        if bad:
            raise GenerationConfigError(
                f"prompts[{i}]: token ids {bad[:5]} outside [0, {padded_vocab})"
            )
        rows.append(ids)
    longest = max(len(r) for r in rows)
    if (
        check_positions
        and max_positions is not None
        and longest + cfg.max_new_tokens > max_positions
    ):
        raise GenerationConfigError(
            f"max_new_tokens: longest prompt ({longest} tokens) + max_new_tokens ({cfg.max_new_tokens}) "
            f"exceeds the model's max_position_embeddings={max_positions}"
        )
    for t in cfg.stop_token_ids:
        if not 0 <= t < vocab:
            raise GenerationConfigError(f"stop_token_ids: {t} is outside [0, vocab_size={vocab})")
    if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < padded_vocab:
        raise GenerationConfigError(
            f"pad_token_id: {cfg.pad_token_id} is outside the model's [0, {padded_vocab}) "
            "(padding is fed to the model)"
        )
    return rows, vocab, longest


@torch.no_grad()
def generate(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig | None = None,
    **overrides: object,
) -> GenerationOutput:
    """Generate continuations of token-id prompts.

    Args:
        model: a :class:`~epochal.model.GPTModel` (or a module with its forward
            signature and a ``config`` with ``vocab_size`` / ``max_position_embeddings``),
            or an encoder-decoder model (``is_encoder_decoder``, e.g.
            :class:`~epochal.model.T5Model`): the prompts are then the encoder's
            input (see :mod:`epochal.model.generation.encoder_decoder`).
        prompts: token ids per prompt (lists of different lengths are fine).
        config: the options (default :class:`GenerationConfig()`).
        **overrides: fields replacing those of ``config`` (``max_new_tokens=8`` ...).

    Returns:
        A :class:`GenerationOutput`.

    Raises:
        GenerationConfigError: an invalid option, an empty or out-of-vocabulary
            prompt, a stop or pad id outside the vocabulary, or prompt +
            ``max_new_tokens`` longer than the model's positions.
    """
    cfg = config or GenerationConfig()
    if overrides:
        cfg = replace(cfg, **overrides)
    if getattr(model, "is_encoder_decoder", False):
        from epochal.model.generation.encoder_decoder import generate_encoder_decoder

        return generate_encoder_decoder(model, prompts, cfg)
    rows, vocab, _ = _prepare(model, prompts, cfg)
    was_training = model.training
    model.eval()
    try:
        if cfg.num_beams > 1:
            return _beam_search(model, rows, cfg, vocab)
        return _sample_or_greedy(model, rows, cfg, vocab)
    finally:
        model.train(was_training)


def _new_cache(model: nn.Module, total: int) -> KVCache:
    """A cache of ``total`` slots (``model.new_cache`` when the model provides one)."""
    factory = getattr(model, "new_cache", None)
    return factory(total) if factory is not None else KVCache(total)


def _device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _sample_or_greedy(
    model: nn.Module, rows: list[list[int]], cfg: GenerationConfig, vocab: int
) -> GenerationOutput:
    device = _device(model)
    stop = cfg.stop_token_ids
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (stop[0] if stop else 0)
    batch = _Batch(rows, cfg.max_new_tokens, pad_id, device)
    b = len(rows)
    generated: list[list[int]] = [[] for _ in range(b)]
    finished = torch.zeros(b, dtype=torch.bool, device=device)
    if cfg.max_new_tokens == 0:
        return _pack(rows, generated, [False] * b)
    stop_t = torch.tensor(stop, dtype=torch.long, device=device)
    generators = None
    if cfg.do_sample:
        generators = [
            torch.Generator(device=device).manual_seed(_row_seed(cfg.seed, i)) for i in range(b)
        ]
    cache = _new_cache(model, batch.total)
    s = batch.prompt_len
    logits = _logits(model, batch.tokens, batch.positions[:, :s], batch.prefill_mask(), cache, True)
    top_p = cfg.top_p
    for step in range(cfg.max_new_tokens):
        logits = logits[:, :vocab]
        if cfg.do_sample:
            nxt = _sample(logits / cfg.temperature, cfg.top_k, top_p, generators)
            if top_p > 0.0 and cfg.top_p_decay > 0.0:
                top_p = top_p * cfg.top_p_decay
                if cfg.top_p_bound > 0.0:
                    top_p = max(top_p, cfg.top_p_bound)
        else:
            nxt = logits.argmax(dim=-1)
        nxt = torch.where(finished, torch.full_like(nxt, pad_id), nxt)
        for row, t, done in zip(generated, nxt.tolist(), finished.tolist()):
            if not done:
                row.append(t)
        if len(stop):
            finished |= torch.isin(nxt, stop_t)
        if bool(finished.all()) or step == cfg.max_new_tokens - 1:
            break
        pos = s + step
        logits = _logits(
            model,
            nxt[:, None],
            batch.positions[:, pos : pos + 1],
            batch.step_mask(pos + 1),
            cache,
            False,
        )
    return _pack(rows, generated, [bool(f) for f in finished.tolist()])


def _pack(rows, generated, finished, scores=None, repeat: int = 1) -> GenerationOutput:
    prompts = [r for r in rows for _ in range(repeat)]
    return GenerationOutput(
        sequences=[p + g for p, g in zip(prompts, generated)],
        tokens=generated,
        prompt_lengths=[len(p) for p in prompts],
        finished=finished,
        scores=scores,
    )


def _beam_search(
    model: nn.Module, rows: list[list[int]], cfg: GenerationConfig, vocab: int
) -> GenerationOutput:
    device = _device(model)
    stop = cfg.stop_token_ids
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else (stop[0] if stop else 0)
    B, K, T = len(rows), cfg.num_beams, cfg.max_new_tokens
    if T == 0:
        empty = [[] for _ in range(B * cfg.num_return_sequences)]
        return _pack(
            rows, empty, [False] * len(empty), [0.0] * len(empty), cfg.num_return_sequences
        )
    batch = _Batch(rows, T, pad_id, device)
    cache = _new_cache(model, batch.total)
    s = batch.prompt_len
    logits = _logits(model, batch.tokens, batch.positions[:, :s], batch.prefill_mask(), cache, True)
    expand = torch.arange(B, device=device).repeat_interleave(K)
    cache.reorder(expand)
    batch.expand(expand)
    logits = logits[expand]
    keep = max(2, 1 + len(stop)) * K
    top_k_mask = torch.arange(keep, device=device) < K
    stop_t = torch.tensor(stop, dtype=torch.long, device=device)
    lp = cfg.length_penalty
    running_seqs = torch.full((B, K, T), pad_id, dtype=torch.long, device=device)
    running_scores = torch.zeros(B, K, device=device)
    running_scores[:, 1:] = _NEG
    fin_seqs = running_seqs.clone()
    fin_scores = torch.full((B, K), _NEG, device=device)
    fin_len = torch.zeros(B, K, dtype=torch.long, device=device)
    fin_done = torch.zeros(B, K, dtype=torch.bool, device=device)
    improvable = torch.ones(B, 1, dtype=torch.bool, device=device)
    offsets = (torch.arange(B, device=device) * K)[:, None]

    def gather(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        while idx.dim() < t.dim():
            idx = idx.unsqueeze(-1)
        return torch.take_along_dim(t, idx, dim=1)

    for t in range(T):
        log_probs = torch.log_softmax(logits[:, :vocab], dim=-1).view(B, K, vocab)
        log_probs = (log_probs + running_scores[:, :, None]).view(B, K * vocab)
        top_lp, top_idx = torch.topk(log_probs, keep, dim=1)
        src = top_idx // vocab
        tok = top_idx % vocab
        cand = gather(running_seqs, src)
        cand[:, :, t] = tok
        hits = torch.isin(tok, stop_t) if len(stop) else torch.zeros_like(tok, dtype=torch.bool)
        if t == T - 1:
            hits = torch.ones_like(hits)
        # beams that continue
        run_lp = top_lp + hits.float() * _NEG
        nxt = torch.topk(run_lp, K, dim=1).indices
        running_seqs = gather(cand, nxt)
        running_scores = gather(run_lp, nxt)
        running_src = gather(src, nxt)
        # finished hypotheses
        just_done = hits & top_k_mask[None, :]
        scored = top_lp / float((t + 1) ** lp)
        if cfg.early_stopping:
            scored = scored + (fin_done.all(dim=1, keepdim=True)).float() * _NEG
        scored = scored + (~improvable).float() * _NEG + (~just_done).float() * _NEG
        merged_scores = torch.cat([fin_scores, scored], dim=1)
        best = torch.topk(merged_scores, K, dim=1).indices
        fin_seqs = gather(torch.cat([fin_seqs, cand], dim=1), best)
        fin_scores = gather(merged_scores, best)
        fin_len = gather(torch.cat([fin_len, torch.full_like(tok, t + 1)], dim=1), best)
        fin_done = gather(torch.cat([fin_done, just_done], dim=1), best)
        # stopping rules (Hugging Face's heuristic with early_stopping=False/True)
        best_running = running_scores[:, :1] / float((t + 1) ** lp)
        worst_done = torch.where(
            fin_done, fin_scores.min(dim=1, keepdim=True).values, torch.full_like(fin_scores, _NEG)
        )
        improvable = improvable & (best_running > worst_done).any(dim=-1, keepdim=True)
        if not bool(improvable.any()):
            break
        if cfg.early_stopping and bool(fin_done.all()):
            break
        if bool(hits.all()):
            break
        cache.reorder((running_src + offsets).reshape(-1))
        pos = s + t
        step_tokens = running_seqs[:, :, t].reshape(-1, 1)
        logits = _logits(
            model,
            step_tokens,
            batch.positions[:, pos : pos + 1],
            batch.step_mask(pos + 1),
            cache,
            False,
        )
    R = cfg.num_return_sequences
    generated: list[list[int]] = []
    finished: list[bool] = []
    scores: list[float] = []
    for i in range(B):
        for r in range(R):
            n = int(fin_len[i, r])
            seq = fin_seqs[i, r, :n].tolist()
            generated.append(seq)
            finished.append(bool(seq) and seq[-1] in stop)
            scores.append(float(fin_scores[i, r]))
    return _pack(rows, generated, finished, scores, R)
