"""The decoding loops shared by decoder-only and encoder-decoder generation.

Logit filtering (top-k / top-p), per-row seeded draws, left-padded prompt batches, greedy /
sampling and beam search over any module with :class:`~epochal.model.GPTModel`'s forward
signature (the semantics are described in :mod:`epochal.model.generation.decoding`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from torch import nn

from epochal.model.generation.config import (
    GenerationConfig,
    GenerationConfigError,
    GenerationOutput,
)
from epochal.model.generation.kv_cache import KVCache

_NEG = -1.0e9


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
