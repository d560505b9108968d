"""Conversion time for a GPT-2-small-sized checkpoint (124M parameters, fp32).

A random ``GPT2LMHeadModel`` (12 x 768, 50257 ids, 1024 positions) is saved
with ``save_pretrained``; then each conversion step is timed (wall time, best of
``--repeats``; files go to a temporary folder on the local disk, so the page
cache is warm after the first round), down to the single-file export for
inference (``epochal convert --to safetensors``). The reference column times what
transformers itself takes to read / write the same folder
(``from_pretrained`` / ``save_pretrained``), as a yardstick for I/O. The
Megatron round trip is checked to give back identical tensors. Run::

    python benchmarks/bench_convert.py            # ~1-2 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch


def best_time(fn, repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--workdir", default=None, help="where to write (default: a temporary folder)"
    )
    args = parser.parse_args()

    from transformers import GPT2Config, GPT2LMHeadModel

    from epochal.convert.megatron.legacy import load_megatron_checkpoint, save_megatron_checkpoint
    from epochal.formats.hf.io import load_hf_checkpoint, save_hf_checkpoint
    from epochal.model import GPTModel
    from epochal.train.state.epochal_ckpt import (
        load_epochal_checkpoint,
        save_consolidated,
        save_epochal_checkpoint,
    )

    root = Path(tempfile.mkdtemp(prefix="bench_convert_", dir=args.workdir))
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            hf = GPT2LMHeadModel(GPT2Config(n_positions=1024, vocab_size=50257)).eval()
        hf.save_pretrained(root / "hf")
        n = sum(p.numel() for p in hf.parameters())
        print(
            f"model: GPT-2 small, {n / 1e6:.1f}M parameters (fp32), torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, files under {root}"
        )
        rows = []

        def hf_to_model():
            loaded = load_hf_checkpoint(root / "hf")
            with torch.device("meta"):
                model = GPTModel(loaded.config)
            model.to_empty(device="cpu")
            model.load_state_dict(loaded.state)  # materializes the transposed Conv1D views
            return loaded

        t, loaded = best_time(hf_to_model, args.repeats)
        ref, _ = best_time(lambda: GPT2LMHeadModel.from_pretrained(root / "hf"), args.repeats)
        rows.append(
            (
                "Hugging Face folder -> epochal GPTModel (read, convert, load)",
                t,
                f"{ref:.2f} s (from_pretrained)",
            )
        )
        config = loaded.config
        state = {k: v.contiguous() for k, v in loaded.state.items()}

        t, _ = best_time(
            lambda: save_hf_checkpoint(config, state, root / "hf_out", overwrite=True), args.repeats
        )
        ref, _ = best_time(lambda: hf.save_pretrained(root / "hf_ref"), args.repeats)
        rows.append(
            (
                "epochal -> Hugging Face folder (convert + write)",
                t,
                f"{ref:.2f} s (save_pretrained)",
            )
        )

        for tp, pp in ((1, 1), (2, 2)):
            out = root / f"megatron_tp{tp}_pp{pp}"
            t, _ = best_time(
                lambda out=out, tp=tp, pp=pp: save_megatron_checkpoint(
                    config, state, out, tensor_parallel=tp, pipeline_parallel=pp, overwrite=True
                ),
                args.repeats,
            )
            rows.append((f"epochal -> Megatron legacy TP{tp} x PP{pp}", t, ""))
        t, back = best_time(
            lambda: load_megatron_checkpoint(root / "megatron_tp2_pp2"), args.repeats
        )
        assert all(torch.equal(back.state[k], v) for k, v in state.items()), (
            "Megatron round trip changed tensors"
        )
        rows.append(("Megatron legacy TP2 x PP2 -> epochal (safe load + merge)", t, ""))

        t, _ = best_time(
            lambda: save_epochal_checkpoint(config, state, root / "run", overwrite=True),
            args.repeats,
        )
        rows.append(("epochal DCP checkpoint write (model only)", t, ""))
        t, _ = best_time(lambda: load_epochal_checkpoint(root / "run"), args.repeats)
        rows.append(("epochal DCP checkpoint read", t, ""))
        single = root / "model.safetensors"
        t, _ = best_time(
            lambda: save_consolidated(config, state, single, overwrite=True), args.repeats
        )
        rows.append(("epochal -> one safetensors file (--to safetensors)", t, ""))
        t, _ = best_time(lambda: load_epochal_checkpoint(single), args.repeats)
        rows.append(("one safetensors file -> epochal", t, ""))

        print()
        print(f"| {'step':<62} | ours (s) | reference |")
        print(f"|{'-' * 64}|----------|-----------|")
        for name, seconds, ref in rows:
            print(f"| {name:<62} | {seconds:>8.2f} | {ref} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
