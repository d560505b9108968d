"""Generation: greedy and beam search equal Hugging Face ``generate``; sampling is seeded and filtered."""

from __future__ import annotations

import pytest
import torch

from epochal.model import GPTModel
from epochal.model.generation.decoding import (
    GenerationConfig,
    GenerationConfigError,
    candidates,
    filter_logits,
    generate,
)
from tests.convert.hf_models import HF_ROPE_SCALING, hf_gpt2, hf_llama, llama_like, ours

transformers = pytest.importorskip("transformers")

GEN = torch.Generator().manual_seed(3)
PROMPTS = [torch.randint(2, 100, (n,), generator=GEN).tolist() for n in (5, 2, 9)]


def converted(hf) -> GPTModel:
    from epochal.formats.hf.gpt2 import ours_config_from_gpt2, ours_state_from_gpt2
    from epochal.formats.hf.llama import ours_config_from_llama, ours_state_from_llama

    cfg_dict = hf.config.to_dict()
    if cfg_dict["model_type"] == "gpt2":
        cfg = ours_config_from_gpt2(cfg_dict)
        state = ours_state_from_gpt2(hf.state_dict(), cfg)
    else:
        cfg = ours_config_from_llama(cfg_dict)
        state = ours_state_from_llama(hf.state_dict(), cfg)
    model = GPTModel(cfg).eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def pair_gpt2():
    hf = hf_gpt2(seed=21, tied=True)
    return hf, converted(hf)


@pytest.fixture(scope="module")
def pair_llama():
    hf = hf_llama(seed=22, groups=2)
    return hf, converted(hf)


@pytest.fixture(scope="module")
def pair_llama3():
    hf = hf_llama(seed=22, groups=2, rope_scaling=dict(HF_ROPE_SCALING["llama3"]))
    model = converted(hf)
    assert model.config.rope_scaling_type == "llama3"
    return hf, model


def hf_generate(hf, prompt, *, eos, **kw) -> list[int]:
    hf.generation_config.eos_token_id = eos
    hf.generation_config.pad_token_id = 0
    x = torch.tensor([prompt])
    out = hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False, **kw)[
        0, len(prompt) :
    ].tolist()
    if eos is not None and eos in out:
        out = out[: out.index(eos) + 1]  # HF pads finished sequences; ours stop at the stop token
    return out


def pick_eos(model) -> int:
    """A token that greedy decoding produces after a few steps, so stopping is exercised."""
    out = generate(model, PROMPTS, max_new_tokens=6).tokens
    counts = torch.bincount(torch.tensor([t for row in out for t in row[1:]]))
    return int(counts.argmax())


@pytest.mark.peer
@pytest.mark.parametrize("which", ["gpt2", "llama", "llama3_rope_scaling"])
def test_greedy_equals_hf_generate(which, request):
    hf, model = request.getfixturevalue(
        {"gpt2": "pair_gpt2", "llama": "pair_llama", "llama3_rope_scaling": "pair_llama3"}[which]
    )
    eos = pick_eos(model)
    for stop in (None, eos):
        for prompt in PROMPTS:
            ref = hf_generate(hf, prompt, eos=stop, max_new_tokens=10, num_beams=1)
            got = generate(
                model, [prompt], max_new_tokens=10, stop_token_ids=() if stop is None else (stop,)
            )
            assert got.tokens[0] == ref
    assert any(generate(model, PROMPTS, max_new_tokens=10, stop_token_ids=(eos,)).finished)


@pytest.mark.peer
@pytest.mark.parametrize("which", ["gpt2", "llama"])
@pytest.mark.parametrize(
    ("beams", "length_penalty", "early"), [(3, 1.0, False), (4, 0.5, True), (2, 2.0, False)]
)
def test_beam_search_equals_hf_generate(which, beams, length_penalty, early, pair_gpt2, pair_llama):
    hf, model = pair_gpt2 if which == "gpt2" else pair_llama
    eos = pick_eos(model)
    finished_any = False
    for prompt in PROMPTS:
        ref = hf_generate(
            hf,
            prompt,
            eos=eos,
            max_new_tokens=8,
            num_beams=beams,
            length_penalty=length_penalty,
            early_stopping=early,
        )
        got = generate(
            model,
            [prompt],
            max_new_tokens=8,
            num_beams=beams,
            length_penalty=length_penalty,
            early_stopping=early,
            stop_token_ids=(eos,),
        )
        assert got.tokens[0] == ref
        finished_any |= got.finished[0]
    assert finished_any  # the stop-token path was exercised


@pytest.mark.peer
def test_beam_search_returns_sorted_hypotheses_like_hf(pair_gpt2):
    hf, model = pair_gpt2
    prompt = PROMPTS[2]
    hf.generation_config.eos_token_id = None
    x = torch.tensor([prompt])
    ref = hf.generate(
        x,
        attention_mask=torch.ones_like(x),
        num_beams=4,
        num_return_sequences=3,
        max_new_tokens=6,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    got = generate(model, [prompt], max_new_tokens=6, num_beams=4, num_return_sequences=3)
    assert got.tokens == [row[len(prompt) :] for row in ref.sequences.tolist()]
    torch.testing.assert_close(torch.tensor(got.scores), ref.sequences_scores, rtol=1e-5, atol=1e-5)
    assert got.scores == sorted(got.scores, reverse=True)


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(num_beams=3, stop_token_ids=(5,)),
        dict(do_sample=True, top_k=20, temperature=0.8, seed=4),
    ],
    ids=["greedy", "beam", "sample"],
)
def test_batch_of_different_lengths_equals_single_prompts(options, pair_llama):
    _, model = pair_llama
    batch = generate(model, PROMPTS, max_new_tokens=7, **options)
    for i, prompt in enumerate(PROMPTS):
        single = generate(model, [prompt], max_new_tokens=7, **options)
        if options.get("do_sample"):
            if i == 0:  # row 0 draws from the same generator alone or in a batch
                assert single.tokens[0] == batch.tokens[0]
        else:
            assert single.tokens[0] == batch.tokens[i]
        assert batch.sequences[i] == prompt + batch.tokens[i]


@pytest.mark.peer
@pytest.mark.parametrize(
    "opts",
    [
        dict(temperature=0.7, top_k=12, top_p=0.9, top_p_decay=0.7, top_p_bound=0.3),
        dict(temperature=1.3, top_p=0.6),
        dict(temperature=0.9, top_k=5),
    ],
    ids=["topk+topp+decay", "topp", "topk"],
)
def test_sampling_is_seeded_and_stays_in_the_allowed_set(pair_llama, opts):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    _, model = pair_llama
    opts = dict(do_sample=True, **opts)
    before = torch.get_rng_state()
    a = generate(model, PROMPTS, max_new_tokens=12, seed=1, **opts)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is untouched
    assert generate(model, PROMPTS, max_new_tokens=12, seed=1, **opts).tokens == a.tokens
    assert generate(model, PROMPTS, max_new_tokens=12, seed=2, **opts).tokens != a.tokens
    top_k, top_p0 = opts.get("top_k", 0), opts.get("top_p", 0.0)
    for prompt, new in zip(PROMPTS, a.tokens):
        seq = torch.tensor([prompt + new])
        with torch.no_grad():
            logits = model(seq)[0, len(prompt) - 1 : -1, :100] / opts["temperature"]
        top_p = top_p0
        for step, token in enumerate(new):
            row = logits[step : step + 1].clone()
            allowed = TopKLogitsWarper(top_k)(None, row.clone()) if top_k else row.clone()
            allowed = TopPLogitsWarper(top_p)(None, allowed) if top_p else allowed
            assert torch.isfinite(allowed[0, token]), (step, token)
            ours_allowed = filter_logits(row, top_k=top_k, top_p=top_p)
            assert torch.equal(torch.isfinite(ours_allowed), torch.isfinite(allowed))
            # the sampler's candidate distribution is exactly the filtered softmax
            probs, order = candidates(row, top_k=top_k, top_p=top_p)
            dense = torch.zeros_like(row).scatter_(1, order, probs)
            torch.testing.assert_close(
                dense / dense.sum(), ours_allowed.softmax(-1), rtol=0, atol=1e-6
            )
            if opts.get("top_p_decay"):
                top_p = max(top_p * opts["top_p_decay"], opts["top_p_bound"])
    if opts.get("top_p_decay"):
        assert top_p == opts["top_p_bound"]  # the schedule reached its bound


def test_padded_vocabulary_ids_are_never_produced():
    model = ours(llama_like(vocab_size=90), seed=1)  # 90 real ids, 128 output rows
    with torch.no_grad():
        model.output.weight[90:] = 50.0 * model.output.weight[:38].sign()  # padded rows would win
    full = model(torch.tensor([PROMPTS[0]]))[0, -1]
    assert int(full.argmax()) >= 90
    for opts in (dict(), dict(num_beams=3), dict(do_sample=True, temperature=5.0)):
        out = generate(model, PROMPTS, max_new_tokens=10, **opts)
        assert all(0 <= t < 90 for row in out.tokens for t in row)


def test_bos_stop_and_edge_cases():
    model = ours(llama_like(), seed=2)
    model.train()
    out = generate(model, [[7, 8]], max_new_tokens=4, add_bos=True, bos_token_id=3)
    assert model.training  # mode restored
    assert out.sequences[0][:3] == [3, 7, 8] and out.prompt_lengths == [3]
    assert generate(model, [[7, 8]], max_new_tokens=0).tokens == [[]]
    first = out.tokens[0][0]
    stopped = generate(
        model, [[7, 8]], max_new_tokens=4, add_bos=True, bos_token_id=3, stop_token_ids=(first,)
    )
    assert stopped.tokens == [[first]] and stopped.finished == [True]
    cfg = GenerationConfig(max_new_tokens=60)
    with pytest.raises(GenerationConfigError, match="max_position_embeddings=64"):
        generate(model, [[1] * 10], cfg)
    with pytest.raises(GenerationConfigError, match=r"prompts\[1\]: empty"):
        generate(model, [[1], []])
    with pytest.raises(GenerationConfigError, match=r"prompts\[0\]: token ids \[500\]"):
        generate(model, [[500]])
    for pad in (-1, 1000):  # the pad id is fed to the model: it must be a row of the embedding
        with pytest.raises(GenerationConfigError, match=rf"pad_token_id: {pad} is outside"):
            generate(model, [[1, 2], [3]], max_new_tokens=2, pad_token_id=pad)
    for bad, match in (
        (dict(temperature=0.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(num_beams=2, do_sample=True), "num_beams"),
        (dict(num_return_sequences=3), "num_return_sequences"),
        (dict(add_bos=True), "bos_token_id"),
    ):
        with pytest.raises(GenerationConfigError, match=match):
            GenerationConfig(**bad)


def test_top_p_one_keeps_every_token():
    """``top_p=1`` filters nothing (as in Hugging Face), although float32 cumulative sums
    pass 1.0 before the end of a large vocabulary."""
    logits = 3 * torch.randn(2, 5000, generator=torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(filter_logits(logits, top_p=1.0)).all())
    probs, order = candidates(logits, top_p=1.0)
    assert bool((probs > 0).all()) and order.shape == logits.shape
    assert not bool(torch.isfinite(filter_logits(logits, top_p=0.999)).all())  # a real threshold


class _UniformLM(torch.nn.Module):
    """Equal logits for every token: top-p keeps a ``top_p`` fraction of the vocabulary."""

    def __init__(self, vocab: int = 100):
        super().__init__()
        self.config = llama_like(vocab_size=vocab, make_vocab_size_divisible_by=1)

    def forward(self, tokens, position_ids=None, attention_mask=None, kv_cache=None, **_):
        kv_cache.advance(tokens.shape[1])
        return torch.zeros(tokens.shape[0], 1, self.config.vocab_size)


def test_top_p_decays_to_its_bound():
    """Megatron's schedule: without a bound top-p decays to the single most likely token;
    with ``top_p_bound`` it keeps that fraction of the (uniform) distribution."""
    opts = dict(max_new_tokens=20, do_sample=True, top_p=0.9, top_p_decay=0.5, seed=3)
    late = [row[-10:] for row in generate(_UniformLM(), [[1], [2]], **opts).tokens]
    assert all(len(set(row)) == 1 for row in late)  # top_p <= 0.9 * 0.5**10: one token left
    bounded = generate(_UniformLM(), [[1], [2]], top_p_bound=0.5, **opts).tokens
    assert all(len(set(row[-10:])) > 5 for row in bounded)  # 50 tokens stay allowed
    early = generate(_UniformLM(), [[1], [2]], **{**opts, "top_p_decay": 0.0}).tokens
    assert all(len(set(row[-10:])) > 5 for row in early)  # no decay: 90 tokens allowed
