"""Generation speed: epochal's KV-cache ``generate`` vs Hugging Face ``generate`` on the same model.

A random ``GPT2LMHeadModel`` (default: 6 layers, 512 wide, 8 heads, GPT-2's
50257-id vocabulary; ``--size gpt2-small`` for 12 x 768) is converted to
epochal's ``GPTModel`` (identical weights), then both generate from the same
prompts with the same settings, no stop token (every call produces exactly
``batch x max_new_tokens`` tokens). The greedy outputs are checked to be equal.
Tokens/s = generated tokens / wall time of the whole call (prefill included);
best of ``--repeats`` interleaved rounds after one warm-up. Prints one table. Run::

    python benchmarks/bench_generate.py              # ~1-2 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import time

import torch

SIZES = {
    "small": dict(n_layer=6, n_embd=512, n_head=8),
    "gpt2-small": dict(n_layer=12, n_embd=768, n_head=12),
}


def best_times(fns, repeats: int) -> list[float]:
    """Best wall time of each function over ``repeats`` interleaved rounds (after one warm-up each)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):  # interleaved, so a load change hits both sides
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = torch's default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import GPT2Config, GPT2LMHeadModel

    from epochal.formats.hf.gpt2 import ours_config_from_gpt2, ours_state_from_gpt2
    from epochal.model import GPTModel
    from epochal.model.generation.decoding import generate

    hf_config = GPT2Config(
        n_positions=1024, vocab_size=50257, bos_token_id=None, eos_token_id=None, **SIZES[args.size]
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(hf_config).eval()
    config = ours_config_from_gpt2(hf_config.to_dict())
    ours = GPTModel(config).eval()
    ours.load_state_dict(ours_state_from_gpt2(hf.state_dict(), config))
    hf.generation_config.pad_token_id = 0
    hf.generation_config.eos_token_id = None
    gen = torch.Generator().manual_seed(1)
    n_params = sum(p.numel() for p in ours.parameters())
    print(
        f"model: GPT-2 {args.size} ({config.num_layers} x {config.hidden_size}, {n_params / 1e6:.0f}M parameters), "
        f"prompt {args.prompt_length} tokens, {args.max_new_tokens} new tokens, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    rows = []
    new = args.max_new_tokens
    cases = [
        ("greedy", 1, {}),
        ("greedy", 4, {}),
        ("sample top-k 50", 4, {"do_sample": True, "top_k": 50}),
        ("beam search x4", 1, {"num_beams": 4}),
    ]
    for name, batch, opts in cases:
        prompts = torch.randint(0, 50257, (batch, args.prompt_length), generator=gen)

        def run_hf(prompts=prompts, opts=opts):
            with torch.no_grad():
                return hf.generate(
                    prompts,
                    attention_mask=torch.ones_like(prompts),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    **opts,
                )

        def run_ours(prompts=prompts, opts=opts):
            return generate(ours, prompts.tolist(), max_new_tokens=new, **opts)

        if name == "greedy":
            assert run_ours().tokens == run_hf()[:, args.prompt_length :].tolist(), (
                "greedy outputs differ"
            )
        t_ours, t_hf = best_times([run_ours, run_hf], args.repeats)
        tokens = batch * new
        rows.append((name, batch, tokens / t_ours, tokens / t_hf))
    print()
    print(
        f"| {'decoding':<17} | batch | ours (tokens/s) | transformers generate (tokens/s) | ours / HF |"
    )
    print(f"|{'-' * 19}|-------|-----------------|----------------------------------|-----------|")
    for name, batch, ours_rate, hf_rate in rows:
        print(
            f"| {name:<17} | {batch:>5} | {ours_rate:>15.1f} | {hf_rate:>32.1f} | {ours_rate / hf_rate:>8.2f}x |"
        )


if __name__ == "__main__":
    main()
