"""Encoder-decoder generation: equal to Hugging Face ``generate()`` for T5 (greedy, beam search).

Also: the cached decoder equals a full decode at every step, sampling is seeded per
row, and the CLI handles T5 checkpoints (``--prompt`` is the encoder input).
"""

from __future__ import annotations

import pytest
import torch

from epochal.model import GenerationConfig, build_model, generate
from epochal.model.generation.decoding import GenerationConfigError
from tests.convert.hf_models import hf_t5
from tests.model.test_t5_model import from_hf

transformers = pytest.importorskip("transformers")

VOCAB = 96
EOS = 2  # a token these random models do produce, so rows stop at different steps
PROMPTS = [[5, 17, 42, 8, 9, 1], [33, 2, 71, 1], [60, 61, 62, 63, 64, 65, 66, 1]]


def hf_generate(hf, prompts, **kwargs) -> list[list[int]]:
    """HF's generated tokens per prompt (start token dropped, cut after EOS)."""
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
        mask[i, : len(p)] = 1
    out = hf.generate(
        input_ids=ids,
        attention_mask=mask,
        decoder_start_token_id=0,
        eos_token_id=EOS,
        pad_token_id=0,
        **kwargs,
    )
    rows = []
    for seq in out[:, 1:].tolist():
        rows.append(seq[: seq.index(EOS) + 1] if EOS in seq else seq)
    return rows


@pytest.fixture(scope="module", params=["1.0", "1.1"])
def models(request):
    # (transformers sizes its generation cache by num_layers: equal depths here)
    hf = hf_t5(request.param, vocab=VOCAB, seed=3, num_decoder_layers=2, std=0.3)
    return hf, from_hf(hf)


def test_greedy_equals_hugging_face(models) -> None:
    hf, ours = models
    expected = hf_generate(hf, PROMPTS, max_new_tokens=12, do_sample=False, num_beams=1)
    got = generate(ours, PROMPTS, max_new_tokens=12, stop_token_ids=(EOS,))
    assert got.tokens == expected
    assert all(seq[0] == 0 for seq in got.sequences) and got.prompt_lengths == [1, 1, 1]
    alone = generate(ours, PROMPTS[1:2], max_new_tokens=12, stop_token_ids=(EOS,))
    assert alone.tokens == got.tokens[1:2]  # padding in the batch changes nothing


@pytest.mark.parametrize(
    ("beams", "length_penalty", "early_stopping", "returns"),
    [(3, 1.0, False, 1), (4, 0.6, True, 2), (2, 2.0, False, 2)],
)
def test_beam_search_equals_hugging_face(models, beams, length_penalty, early_stopping, returns):
    hf, ours = models
    expected = hf_generate(
        hf,
        PROMPTS,
        max_new_tokens=10,
        num_beams=beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        num_return_sequences=returns,
        do_sample=False,
    )
    got = generate(
        ours,
        PROMPTS,
        max_new_tokens=10,
        num_beams=beams,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        num_return_sequences=returns,
        stop_token_ids=(EOS,),
    )
    assert got.tokens == expected


def test_cached_decoding_equals_full_decodes() -> None:
    """Each greedy step's choice equals the argmax of a full (uncached) decode of the prefix."""
    from epochal.model import ModelConfig

    config = ModelConfig(
        type="t5",
        vocab_size=VOCAB,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        output_bias=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = build_model(config, seed=5).eval()
    out = generate(model, PROMPTS, max_new_tokens=8)
    for prompt, tokens in zip(PROMPTS, out.tokens):
        enc = torch.tensor([prompt])
        with torch.no_grad():
            memory = model.encode(enc)
            for t in range(len(tokens)):
                dec = torch.tensor([[0, *tokens[:t]]])
                logits = model.decode(dec, memory)[0, -1, :VOCAB]
                assert int(logits.argmax()) == tokens[t]


def test_sampling_is_seeded_per_row(models) -> None:
    _, ours = models
    cfg = GenerationConfig(max_new_tokens=8, do_sample=True, top_k=20, top_p=0.9, seed=11)
    a = generate(ours, PROMPTS, cfg)
    b = generate(ours, PROMPTS, cfg)
    first = generate(ours, PROMPTS[:1], cfg)
    assert a.tokens == b.tokens and a.tokens[:1] == first.tokens
    other = generate(ours, PROMPTS, GenerationConfig(**{**cfg.__dict__, "seed": 12}))
    assert other.tokens != a.tokens


def test_learned_positions_limit_is_checked() -> None:
    from epochal.model import ModelConfig

    config = ModelConfig(
        type="t5", vocab_size=VOCAB, hidden_size=32, num_layers=1, num_attention_heads=4,
        max_position_embeddings=8,
    )  # fmt: skip
    model = build_model(config)
    with pytest.raises(GenerationConfigError, match="max_position_embeddings=8"):
        generate(model, [[3, 4]], max_new_tokens=8)
    with pytest.raises(GenerationConfigError, match="decoder_start_token_id"):
        generate(model, [[3, 4]], max_new_tokens=2, decoder_start_token_id=10_000)


def test_generate_cli_on_a_hugging_face_t5_folder(tmp_path, capsys) -> None:
    """``epochal generate --checkpoint <HF T5 folder> --prompt-ids ...``: the encoder input."""
    import json

    from epochal.cli import main

    hf = hf_t5("1.1", vocab=VOCAB, seed=3, num_decoder_layers=2, std=0.3)
    hf.save_pretrained(tmp_path / "hf")
    out_file = tmp_path / "out.jsonl"
    argv = ["generate", "--checkpoint", str(tmp_path / "hf"), "--max-new-tokens", "6"]
    argv += ["--num-beams", "3", "--output", str(out_file)]
    for prompt in PROMPTS:
        argv += ["--prompt-ids", ",".join(map(str, prompt))]
    assert main(argv) == 0
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    # config.json's eos_token_id (1) is the stop token, as transformers uses it
    longest = max(len(p) for p in PROMPTS)
    ids = torch.zeros(len(PROMPTS), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(PROMPTS):
        ids[i, : len(p)], mask[i, : len(p)] = torch.tensor(p), 1
    expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, num_beams=3)
    for record, row in zip(records, expected[:, 1:].tolist()):
        assert record["tokens"] == (row[: row.index(1) + 1] if 1 in row else row)
    assert "tokens/s" in capsys.readouterr().out
