"""T5 generation speed: epochal's encoder-decoder decoding vs ``transformers``' ``generate()``.

One random ``T5ForConditionalGeneration`` (T5 v1.1 layout: gated GELU, relative bias;
``--hidden`` wide, ``--layers`` encoder + decoder blocks, 8 heads, a 4,000-id vocabulary)
converted to epochal with ``epochal.formats.hf.t5``; prompts of ``--prompt-length``
ids; ``--new-tokens`` generated per prompt with no stop token (both run the full
length). Greedy at batch 1 and 8, beam search (4 beams) at batch 1. Each cell is the
best of ``--repeats`` runs after a warm-up, ours and theirs alternating; the outputs
are checked to be equal.

Run::

    python benchmarks/bench_generate_t5.py        # ~1 minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import transformers

    from epochal.formats.hf.t5 import ours_config_from_t5, ours_state_from_t5
    from epochal.model import build_model, generate

    torch.manual_seed(0)
    vocab = 4000
    hf = transformers.T5ForConditionalGeneration(
        transformers.T5Config(
            vocab_size=vocab,
            d_model=args.hidden,
            d_kv=args.hidden // 8,
            d_ff=args.hidden * 4,
            num_layers=args.layers,
            num_heads=8,
            feed_forward_proj="gated-gelu",
            tie_word_embeddings=False,
            dropout_rate=0.0,
        )
    ).eval()
    weights = hf.state_dict()
    config = ours_config_from_t5(hf.config.to_dict(), weights)
    ours = build_model(config).eval()
    ours.load_state_dict(ours_state_from_t5(weights, config), strict=True)
    g = torch.Generator().manual_seed(1)
    n = args.new_tokens
    print(
        f"T5 v1.1 layout, hidden {args.hidden}, {args.layers}+{args.layers} blocks, vocab {vocab}, "
        f"{sum(p.numel() for p in hf.parameters()) / 1e6:.1f}M parameters; prompts of "
        f"{args.prompt_length} ids, {n} new tokens each; torch threads {torch.get_num_threads()}"
    )
    print(f"\n{'decoding':<22} {'epochal tok/s':>14} {'transformers':>13} {'ratio':>6}")
    for name, batch, beams in (
        ("greedy, batch 1", 1, 1),
        ("greedy, batch 8", 8, 1),
        ("beam 4, batch 1", 1, 4),
    ):
        prompts = torch.randint(2, vocab, (batch, args.prompt_length), generator=g)

        def run_ours(prompts=prompts, beams=beams):
            return generate(ours, prompts.tolist(), max_new_tokens=n, num_beams=beams).tokens

        def run_hf(prompts=prompts, beams=beams):
            out = hf.generate(
                input_ids=prompts,
                max_new_tokens=n,
                min_new_tokens=n,
                num_beams=beams,
                do_sample=False,
                eos_token_id=None,
                decoder_start_token_id=0,
                pad_token_id=0,
            )
            return out[:, 1:].tolist()

        with torch.no_grad():
            assert run_ours() == run_hf(), name
            best = [float("inf"), float("inf")]
            for _ in range(args.repeats):
                for k, fn in enumerate((run_ours, run_hf)):
                    start = time.perf_counter()
                    fn()
                    best[k] = min(best[k], time.perf_counter() - start)
        tokens = batch * n
        ours_rate, hf_rate = tokens / best[0], tokens / best[1]
        print(f"{name:<22} {ours_rate:14,.0f} {hf_rate:13,.0f} {ours_rate / hf_rate:5.2f}x")


if __name__ == "__main__":
    main()
